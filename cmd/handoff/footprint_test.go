package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestSidecarBuildLeavesOutTheWebhook: bin/handoff-sidecar (the build tag
// sidecaronly), which injected pods run, links neither controller-runtime
// nor cert-controller nor the webhook and injector packages, whose code and
// init-time data are 4–6 MiB of resident memory, nor zap (about 1 MiB;
// docs/performance.md, Footprint); and it still has every command the
// sidecar and install containers and the preStop hook run.
func TestSidecarBuildLeavesOutTheWebhook(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "sidecaronly", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"sigs.k8s.io/controller-runtime", "github.com/open-policy-agent/cert-controller",
			"github.com/handoff-dev/handoff/webhook", "github.com/handoff-dev/handoff/inject", "go.uber.org/zap"} {
			if pkg == banned || strings.HasPrefix(pkg, banned+"/") {
				t.Errorf("the sidecaronly build links %s", pkg)
			}
		}
	}
	bin := t.TempDir() + "/handoff-sidecar"
	if out, err := exec.Command("go", "build", "-tags", "sidecaronly", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, cmd := range []string{"sidecar", "prestop", "install", "version"} {
		if out, err := exec.Command(bin, cmd, "--help").CombinedOutput(); err != nil {
			t.Errorf("handoff-sidecar %s --help: %v\n%s", cmd, err, out)
		}
	}
}
