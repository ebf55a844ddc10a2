// Package faultproxy puts a TCP proxy (toxiproxy, run in this process)
// between a test's client and a server, such as the envtest kube-apiserver,
// so the test can cut the connection, slow it, hang it or reset it, and put
// it back. TLS passes through untouched: a client pointed at the proxy on
// 127.0.0.1 talks TLS to the server, whose envtest serving certificate
// covers 127.0.0.1.
package faultproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"k8s.io/client-go/rest"
)

// Proxy is one toxiproxy proxy listening on 127.0.0.1.
type Proxy struct {
	p *toxiproxy.Proxy
}

// New starts a proxy on a free port of 127.0.0.1 that forwards to
// upstream (host:port), and stops it when the test ends.
func New(t testing.TB, upstream string) *Proxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, t.Name(), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("faultproxy: starting a proxy to %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{p: p}
}

// ForConfig starts a proxy in front of the server of cfg and returns it
// with a copy of cfg whose Host is the proxy (same scheme, TLS settings
// and credentials).
func ForConfig(t testing.TB, cfg *rest.Config) (*Proxy, *rest.Config) {
	t.Helper()
	u, err := url.Parse(cfg.Host)
	if err != nil || u.Host == "" {
		t.Fatalf("faultproxy: rest.Config Host %q is not a URL with a host:port: %v", cfg.Host, err)
	}
	p := New(t, u.Host)
	out := rest.CopyConfig(cfg)
	u.Host = p.Addr()
	out.Host = u.String()
	return p, out
}

// Addr is the proxy's listen address, 127.0.0.1:port.
func (p *Proxy) Addr() string {
	p.p.Lock()
	defer p.p.Unlock()
	return p.p.Listen
}

// Cut makes the server unreachable: the proxy closes every connection
// through it and stops listening, so new connections are refused.
func (p *Proxy) Cut() { p.p.Stop() }

// Restore removes every toxic and listens again on the same address, if cut.
func (p *Proxy) Restore() error {
	p.p.Toxics.ResetToxics(context.Background())
	p.p.Lock()
	enabled := p.p.Enabled
	p.p.Unlock()
	if enabled {
		return nil
	}
	if err := p.p.Start(); err != nil {
		return fmt.Errorf("faultproxy: listening again on %s: %w", p.Addr(), err)
	}
	return nil
}

// Latency delays every chunk of data from the server to the client (and
// so every response) by d, on existing connections and new ones.
func (p *Proxy) Latency(d time.Duration) error {
	return p.add("latency", "downstream", map[string]int64{"latency": d.Milliseconds()})
}

// Hang drops every byte from the client to the server without closing the
// connection: requests get no answer. Connections stay hung until Restore
// removes the toxic; a client is left with its own timeouts.
func (p *Proxy) Hang() error {
	return p.add("timeout", "upstream", map[string]int64{"timeout": 0})
}

// Reset answers the next data from the client with a TCP reset (RST) of
// its connection, on existing connections and new ones.
func (p *Proxy) Reset() error {
	return p.add("reset_peer", "upstream", map[string]int64{"timeout": 0})
}

// add adds one toxic through toxiproxy's own JSON form of it, the one its
// HTTP API takes (type, stream, attributes in milliseconds).
func (p *Proxy) add(kind, stream string, attributes map[string]int64) error {
	body, err := json.Marshal(map[string]any{"type": kind, "stream": stream, "toxicity": 1.0, "attributes": attributes})
	if err != nil {
		return err
	}
	if _, err := p.p.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		return fmt.Errorf("faultproxy: adding a %s toxic (%s): %w", kind, stream, err)
	}
	return nil
}
