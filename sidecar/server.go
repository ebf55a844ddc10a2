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
// /v1/status. Serve it on loopback only. POST /v1/prestop requires the
// pod's token (Options.Token; prestop.Handler answers 401 without it).
// GET /v1/status does not: it changes nothing, and shows only what the Pod
// and its Leases show any reader of the API (identity, holders, fencing
// tokens, the last report), so that an operator can read it with curl from
// any container of the pod.
func (c *Coordinator) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(protocol.PreStopPath, prestop.Handler(c, c.token))
	mux.HandleFunc("GET "+protocol.StatusPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(c.Status())
	})
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
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{DisableCompression: true}))
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
