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
// /v1/status. Serve it on loopback only.
func (c *Coordinator) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(protocol.PreStopPath, prestop.Handler(c))
	mux.HandleFunc("GET "+protocol.StatusPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(c.Status())
	})
	return mux
}

// ProbesHandler serves the read-only port: /metrics from gatherer,
// /healthz, and /readyz. Readiness never depends on leadership: a standby is
// as ready as the leader.
func ProbesHandler(gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /readyz", ok)
	return mux
}
