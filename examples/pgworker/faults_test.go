package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// The liveness endpoint fails once asked to and stays failed; a crash
// exits with its code.
func TestFaultEndpoints(t *testing.T) {
	// The handler answers before it exits, so the exit is read from a
	// channel the handler's goroutine writes.
	exited := make(chan int, 1)
	srv := httptest.NewServer(faultHandler(logr.Discard(), func(code int) { exited <- code }))
	defer srv.Close()
	status := func(method, path string) int {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(http.MethodGet, faultHealthzPath); got != http.StatusOK {
		t.Fatalf("healthz before the fault: %d, want 200", got)
	}
	if got := status(http.MethodPost, faultUnhealthyPath); got != http.StatusOK {
		t.Fatalf("POST %s: %d, want 200", faultUnhealthyPath, got)
	}
	for range 2 {
		if got := status(http.MethodGet, faultHealthzPath); got != http.StatusServiceUnavailable {
			t.Fatalf("healthz after the fault: %d, want 503", got)
		}
	}
	select {
	case code := <-exited:
		t.Fatalf("exited with %d before a crash was asked for", code)
	default:
	}
	_ = status(http.MethodPost, faultCrashPath)
	select {
	case code := <-exited:
		if code != faultCrashCode {
			t.Errorf("crash exited with %d, want %d", code, faultCrashCode)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit 10 s after POST " + faultCrashPath)
	}
}
