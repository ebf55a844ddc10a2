package webhook

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

// The webhook's health port answers as the manager's did: /healthz and
// /readyz, and each check under them, 200 when it passes, 500 when not.
func TestWebhookHealthPort(t *testing.T) {
	srv, err := serveHealth("127.0.0.1:0", map[string]healthz.Checker{"ping": healthz.Ping},
		map[string]healthz.Checker{"webhook": func(*http.Request) error { return errors.New("not started") }}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	for path, want := range map[string]int{"/healthz": 200, "/healthz/ping": 200, "/readyz": 500, "/readyz/webhook": 500} {
		resp, err := probeClient.Get("http://" + srv.Addr + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %s; want %d", path, resp.Status, want)
		}
	}
}

// probeClient probes as the kubelet does: a new connection each time, a
// 1 s timeout (timeoutSeconds' default).
var probeClient = &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}

// Each of zap's four level names is a --log-level.
func TestWebhookLogLevel(t *testing.T) {
	for _, s := range []string{"error", "warn", "info", "debug"} {
		if l, err := webhookLogLevel(s); err != nil || l.String() != s {
			t.Errorf("webhookLogLevel(%q) = %v, %v; want %s", s, l, err, s)
		}
	}
	if _, err := webhookLogLevel("verbose"); err == nil {
		t.Error("webhookLogLevel(verbose) accepted")
	}
}
