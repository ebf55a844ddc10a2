package sidecar

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

// ControlHandler serves the control API: POST /v1/prestop and GET
// /v1/status, on the control socket (or, by opt-in, loopback). Every call
// must be signed with the pod's token (Options.Token; protocol.Signed
// answers 401 otherwise), the status too: a process that cannot sign learns
// nothing of the sequence from it, and reads Leases and Events through the
// API like any other reader.
func (c *Coordinator) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(protocol.PreStopPath, prestop.Handler(c, c.verifier))
	mux.Handle("GET "+protocol.StatusPath, protocol.Signed(c.verifier, 1<<10, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(c.Status())
	})))
	return mux
}

// ProbesHandler serves the read-only port: /metrics from gatherer,
// /healthz (200 while the process serves), and /readyz: 200 "ok" while
// ready returns nil, else 503 with its error (for the Coordinator,
// (*Coordinator).Ready: not coordinating during a sequence and after one
// until it re-arms). Readiness never depends on leadership: a standby is as
// ready as the leader. A nil ready is always ready.
func ProbesHandler(gatherer prometheus.Gatherer, ready func() error) http.Handler {
	mux := http.NewServeMux()
	// Uncompressed: a gzip (or zstd) writer per scrape grew the idle
	// sidecar by 1 MiB and more, for a page of a few KiB to a scraper on
	// the pod network (docs/performance.md, Footprint).
	metrics := promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{DisableCompression: true})
	mux.Handle("GET /metrics", metrics)
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		ok(w, r)
	})
	return mux
}
