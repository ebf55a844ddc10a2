package main

// Fault injection for the end-to-end tests (--fault-addr): the worker's own
// liveness endpoint, which can be made to fail, and a crash on request.
// Off unless the flag is given; never give it in production: the endpoints
// have no authentication and listen beyond loopback, where the kubelet's
// probes reach them.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// Paths served on --fault-addr.
const (
	// faultHealthzPath answers 200 "ok" while the worker is healthy and 503
	// once faultUnhealthyPath was called: a liveness probe on it then makes
	// the kubelet kill and restart the worker container (running its
	// preStop hook first).
	faultHealthzPath = "/healthz"
	// faultUnhealthyPath (POST) makes faultHealthzPath fail from now until
	// this process exits; the restarted container is healthy again.
	faultUnhealthyPath = "/fault/unhealthy"
	// faultCrashPath (POST) exits the process at once with faultCrashCode,
	// as a crash would: no claim is handed back, no connection closed.
	faultCrashPath = "/fault/crash"
)

// faultCrashCode is the exit code of a crash on request.
const faultCrashCode = 3

// startFaults serves the fault endpoints on addr (host:port, like :7460)
// until the returned stop is called.
func startFaults(addr string, log logr.Logger) (stop func(), err error) {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--fault-addr: %w", err)
	}
	srv := &http.Server{Handler: faultHandler(log, os.Exit), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "fault endpoints stopped")
		}
	}()
	return func() { _ = srv.Close() }, nil
}

// faultHandler serves the fault endpoints; exit ends the process.
func faultHandler(log logr.Logger, exit func(code int)) http.Handler {
	var unhealthy atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+faultHealthzPath, func(w http.ResponseWriter, _ *http.Request) {
		if unhealthy.Load() {
			http.Error(w, "unhealthy on request (POST "+faultUnhealthyPath+")", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("POST "+faultUnhealthyPath, func(w http.ResponseWriter, _ *http.Request) {
		unhealthy.Store(true)
		log.Info("fault: liveness fails from now on")
		_, _ = w.Write([]byte("unhealthy\n"))
	})
	mux.HandleFunc("POST "+faultCrashPath, func(w http.ResponseWriter, _ *http.Request) {
		log.Info("fault: crashing", "exitCode", faultCrashCode)
		_, _ = w.Write([]byte("crashing\n"))
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		exit(faultCrashCode)
	})
	return mux
}
