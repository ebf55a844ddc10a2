package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-logr/logr"
)

// The liveness endpoint fails once asked to and stays failed; a crash
// exits with its code.
func TestFaultEndpoints(t *testing.T) {
	exited := -1
	srv := httptest.NewServer(faultHandler(logr.Discard(), func(code int) { exited = code }))
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
	if exited != -1 {
		t.Fatalf("exited with %d before a crash was asked for", exited)
	}
	_ = status(http.MethodPost, faultCrashPath)
	if exited != faultCrashCode {
		t.Errorf("crash exited with %d, want %d", exited, faultCrashCode)
	}
}
