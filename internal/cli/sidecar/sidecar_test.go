package sidecar

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/rest"

	"github.com/handoff-dev/handoff/leaderelection"
	coord "github.com/handoff-dev/handoff/sidecar"
)

// The Lease client has its own rate budget, the one given, and no
// client-wide timeout: a rest.Config.Timeout would cut the standby's watch
// of its Lease every timeout (the elector bounds each Lease request
// instead).
func TestLeaseClientKeepsWatchesOpen(t *testing.T) {
	rc := &rest.Config{Host: "https://example.invalid", QPS: 5, Burst: 10}
	b := leaderelection.ClientBudget(100, 2*time.Second)
	got := leaseConfig(rc, b)
	if got.Timeout != 0 || got.QPS != b.QPS || got.Burst != b.Burst {
		t.Errorf("Lease client: timeout %s, QPS %v, burst %d; want no timeout, %v, %d", got.Timeout, got.QPS, got.Burst, b.QPS, b.Burst)
	}
	if rc.QPS != 5 || rc.Burst != 10 {
		t.Errorf("the shared config was changed: QPS %v, burst %d", rc.QPS, rc.Burst)
	}
}

// The HTTP/2 health check is set from the renew deadline, unless the
// variables are already set.
func TestHTTP2HealthCheck(t *testing.T) {
	for _, tc := range []struct {
		renewDeadline time.Duration
		preset        map[string]string
		want          map[string]string
	}{
		{10 * time.Second, nil, map[string]string{"HTTP2_READ_IDLE_TIMEOUT_SECONDS": "2", "HTTP2_PING_TIMEOUT_SECONDS": "5"}},
		{3 * time.Second, nil, map[string]string{"HTTP2_READ_IDLE_TIMEOUT_SECONDS": "1", "HTTP2_PING_TIMEOUT_SECONDS": "1"}},
		{30 * time.Second, map[string]string{"HTTP2_PING_TIMEOUT_SECONDS": "9"},
			map[string]string{"HTTP2_READ_IDLE_TIMEOUT_SECONDS": "6", "HTTP2_PING_TIMEOUT_SECONDS": "9"}},
	} {
		env := map[string]string{}
		for k, v := range tc.preset {
			env[k] = v
		}
		lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
		set := func(k, v string) error { env[k] = v; return nil }
		setHTTP2HealthCheck(lookup, set, tc.renewDeadline)
		for k, want := range tc.want {
			if env[k] != want {
				t.Errorf("renew deadline %s: %s=%q, want %q", tc.renewDeadline, k, env[k], want)
			}
		}
	}
}

// /metrics answers uncompressed even to a scraper that offers gzip, as
// Prometheus does: a compressor per scrape grew the idle sidecar by 1 MiB
// and more (docs/performance.md, Footprint).
func TestMetricsAreNotCompressed(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	srv := httptest.NewServer(coord.ProbesHandler(reg, nil))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "gzip, zstd")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" || !strings.Contains(string(body), "go_goroutines ") {
		t.Errorf("GET /metrics offering gzip: status %s, Content-Encoding %q, %d bytes; want the text page uncompressed", resp.Status, enc, len(body))
	}
}
