package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/handoff-dev/handoff/internal/cli/serve"
	"github.com/handoff-dev/handoff/internal/connlimit"
)

var (
	// Timeouts are the admission port's bounds: the apiserver calls the webhook with a timeout of
	// at most 30 s (timeoutSeconds; the chart's is 10 s), its body an
	// AdmissionReview that controller-runtime reads up to 7 MiB of. The
	// TLS handshake must end within the shortest of readHeader, read and
	// write (net/http): 10 s. Idle: the apiserver's keep-alive.
	// Connections: the apiserver is the only client, from one address per
	// apiserver instance, with a connection per request in flight (HTTP/1.1
	// only, below); 128 from one address is far more than its admissions
	// of pods hold at once. 512 in all. Past either cap, a new connection
	// takes the place of one idle between requests or that has waited
	// more than a second for its handshake and request (connlimit): a
	// flood that holds slots open and quiet (4 addresses of kept-alive
	// connections took all 512 before, and pods were admitted without the
	// sidecar) does not keep the apiserver's calls out. An idle TLS
	// connection before its handshake costs about what a probe port's
	// does (serve.IdleConnBytes): 9 MiB at the total, against the webhook's
	// 256 MiB limit (the chart's webhook.resources).
	Timeouts = serve.Timeouts{ReadHeader: 10 * time.Second, Read: 30 * time.Second, Write: 30 * time.Second, Idle: 90 * time.Second,
		Conns: connlimit.Limits{Total: 512, PerAddr: 128}}
	// healthTimeouts: the kubelet's probes of the webhook, as the
	// sidecar's probe port (internal/cli/sidecar.ProbeTimeouts), and as few connections.
	healthTimeouts = serve.Timeouts{ReadHeader: 5 * time.Second, Read: 5 * time.Second, Write: 10 * time.Second, Idle: 30 * time.Second,
		Conns: connlimit.Limits{Total: 64, PerAddr: 16}}
)

// webhookServer is controller-runtime's webhook server (its registration
// and mux, from ctrlwebhook.NewServer) served by Start on a listener with
// Timeouts' caps and timeouts, which ctrlwebhook.DefaultServer
// cannot be given (it listens with tls.Listen itself, no cap, a
// read-header timeout of 32 s). TLS as DefaultServer's: tls.crt and
// tls.key in certDir, reloaded when they change (certwatcher), but
// HTTP/1.1 only: over HTTP/2 one connection carries up to 250 requests at
// once, which a connection cap does not bound.
type webhookServer struct {
	ctrlwebhook.Server
	port    int
	certDir string
	log     logr.Logger
	started atomic.Bool
}

func newWebhookServer(port int, certDir string, log logr.Logger) *webhookServer {
	return &webhookServer{Server: ctrlwebhook.NewServer(ctrlwebhook.Options{Port: port, CertDir: certDir}), port: port, certDir: certDir, log: log}
}

// Start serves the webhooks until ctx ends, then shuts the server down
// within a minute (as DefaultServer). Its errors: the certificate files
// cannot be read, or the port cannot be bound.
func (s *webhookServer) Start(ctx context.Context) error {
	watcher, err := certwatcher.New(filepath.Join(s.certDir, "tls.crt"), filepath.Join(s.certDir, "tls.key"))
	if err != nil {
		return err
	}
	go func() {
		if err := watcher.Start(ctx); err != nil {
			s.log.Error(err, "certificate watcher")
		}
	}()
	cfg := &tls.Config{GetCertificate: watcher.GetCertificate, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", net.JoinHostPort("", strconv.Itoa(s.port)))
	if err != nil {
		return err
	}
	t := Timeouts
	limited := connlimit.Listen(ln, t.Conns)
	srv := &http.Server{Handler: s.WebhookMux(), BaseContext: func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, WriteTimeout: t.Write, IdleTimeout: t.Idle, MaxHeaderBytes: serve.MaxHeaderBytes,
		ConnState: limited.ConnState,
		// HTTP/1.1 only (TLSNextProto empty, not nil).
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	s.started.Store(true)
	s.log.Info("serving webhooks", "port", s.port, "connections", t.Conns.Total, "perAddress", t.Conns.PerAddr)
	if err := srv.Serve(tls.NewListener(limited, cfg)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-stopped
	return nil
}

// StartedChecker is healthy once Start serves and a TLS handshake with it
// on loopback succeeds within a second.
func (s *webhookServer) StartedChecker() healthz.Checker {
	return func(*http.Request) error {
		if !s.started.Load() {
			return errors.New("webhook server has not been started yet")
		}
		d := &net.Dialer{Timeout: time.Second}
		conn, err := tls.DialWithDialer(d, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a liveness handshake with itself
		if err != nil {
			return fmt.Errorf("webhook server is not reachable: %w", err)
		}
		return conn.Close()
	}
}

// serveHealth serves /healthz and /readyz (controller-runtime's
// healthz.Handler, as the manager's health probe server, which cannot be
// given caps) at addr within healthTimeouts.
func serveHealth(addr string, live, ready map[string]healthz.Checker, log logr.Logger) (*http.Server, error) {
	mux := http.NewServeMux()
	for path, checks := range map[string]map[string]healthz.Checker{"/healthz": live, "/readyz": ready} {
		h := http.StripPrefix(path, &healthz.Handler{Checks: checks})
		mux.Handle(path, h)
		mux.Handle(path+"/", h)
	}
	return serve.Listen(addr, mux, log, healthTimeouts)
}
