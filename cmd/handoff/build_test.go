package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/internal/cli/clitest"
)

// The repository's chart carries no release's version: a release stamps
// its version and appVersion (helm package --version --app-version) from
// the same tag as the binaries and images, and the placeholder is a valid
// semantic version that helm lint accepts.
func TestChartVersionIsTheDevPlaceholder(t *testing.T) {
	chart, err := os.ReadFile("../../charts/handoff/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(chart), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && (k == "version" || k == "appVersion") {
			got[k] = strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	if got["version"] != "v0.0.0-dev" || got["appVersion"] != "v0.0.0-dev" {
		t.Errorf("Chart.yaml version %q, appVersion %q; want v0.0.0-dev in both, which a release replaces", got["version"], got["appVersion"])
	}
}

// One version, stamped once as the Makefile stamps it, is everywhere a
// build of bin/handoff puts one: its client version, the injector's default
// image (and no development note in its help), and the injected pods'
// handoff.dev/version annotation and label.
func TestStampedVersionIsEverywhere(t *testing.T) {
	if testing.Short() {
		t.Skip("builds bin/handoff")
	}
	const v = "v9.8.7"
	bin := filepath.Join(t.TempDir(), "handoff")
	build := exec.Command("go", "build", "-ldflags", "-X github.com/handoff-dev/handoff/version.version="+v, "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "version", "--client").Output(); err != nil || !strings.HasPrefix(string(out), "Client version: "+v+" (") {
		t.Errorf("handoff version --client: %v, %q; want Client version: %s", err, out, v)
	}
	help, err := exec.Command(bin, "inject", "--help").Output()
	if err != nil || !strings.Contains(string(help), `(default "ghcr.io/handoff-dev/handoff-sidecar:`+v+`")`) || strings.Contains(string(help), "development build") {
		t.Errorf("handoff inject --help: %v\n%s\nwant the default image ghcr.io/handoff-dev/handoff-sidecar:%s, and no development note", err, help, v)
	}
	inject := exec.Command(bin, "inject")
	inject.Stdin = strings.NewReader(clitest.Deployment("cancel"))
	out, err := inject.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"image: ghcr.io/handoff-dev/handoff-sidecar:" + v,
		"handoff.dev/version: " + v, // the annotation and the label
	} {
		if n := strings.Count(string(out), want); n != 2 {
			t.Errorf("injected manifest has %q %d times, want 2 (install step and sidecar, or annotation and label):\n%s", want, n, out)
		}
	}
}
