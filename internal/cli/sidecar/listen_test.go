package sidecar

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/handoff-dev/handoff/internal/cli/clitest"
	"github.com/handoff-dev/handoff/internal/cli/serve"
	coord "github.com/handoff-dev/handoff/sidecar"
)

// The probe port holds ProbeTimeouts.Conns.PerAddr idle connections from
// one address and resets the next at once, while another address (the
// kubelet's) is still answered; a header over serve.MaxHeaderBytes (and the 4 KiB
// net/http reads past it) is answered 431.
func TestProbePortCapsConnectionsPerAddress(t *testing.T) {
	srv, err := serve.Listen("127.0.0.1:0", coord.ProbesHandler(prometheus.NewRegistry(), nil), logr.Discard(), ProbeTimeouts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	for range ProbeTimeouts.Conns.PerAddr {
		c, err := d.Dial("tcp", srv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
	}
	// The server takes the held ones first (one accept loop, in order);
	// the next is reset, before the dial returns or at the first read.
	c, err := d.Dial("tcp", srv.Addr)
	if err == nil {
		defer func() { _ = c.Close() }()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("connection %d from 127.0.0.2: %v; want it reset at once", ProbeTimeouts.Conns.PerAddr+1, err)
	}
	if err := clitest.Probe(srv.Addr); err != nil {
		t.Errorf("GET /healthz from 127.0.0.1 with 127.0.0.2 at its cap: %v; want 200", err)
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+srv.Addr+"/healthz", nil)
	if err != nil {
		t.Fatal(err)
	}
	// net/http reads up to 4 KiB past MaxHeaderBytes (its bufio slop).
	big := serve.MaxHeaderBytes + 4<<10 + 1
	req.Header.Set("X-Big", strings.Repeat("x", big))
	resp, err := clitest.ProbeClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a header of %d bytes: %s; want 431", big, resp.Status)
	}
}
