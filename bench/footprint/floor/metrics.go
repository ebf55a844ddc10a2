//go:build metrics

package main

import (
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// With -tags metrics the floor also serves prometheus/client_golang's
// default registry (its Go and process collectors, registered when the
// package is imported) on a loopback port, uncompressed as the sidecar
// serves it: the share of the sidecar's footprint that is the metrics
// library alone (bench/footprint).
func init() {
	serveMetrics = func() error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		go func() {
			_ = http.Serve(l, promhttp.HandlerFor(prometheus.DefaultGatherer, promhttp.HandlerOpts{DisableCompression: true}))
		}()
		return nil
	}
}
