package kube

import "testing"

func TestImageTag(t *testing.T) {
	for ref, want := range map[string]string{
		"ghcr.io/handoff-dev/handoff:v0.2.0":            "v0.2.0",
		"ghcr.io/handoff-dev/handoff:v0.2.0@sha256:abc": "v0.2.0",
		"ghcr.io/handoff-dev/handoff@sha256:abc":        "",
		"localhost:5000/handoff":                        "",
		"localhost:5000/handoff:v0.2.1-dev.3.g1a2b3c4":  "v0.2.1-dev.3.g1a2b3c4",
		"handoff":     "",
		"handoff:e2e": "e2e",
	} {
		if got := ImageTag(ref); got != want {
			t.Errorf("ImageTag(%q) = %q, want %q", ref, got, want)
		}
	}
}
