//go:build !sidecaronly

package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/version"
)

const deployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: orders}
spec:
  selector: {matchLabels: {app: orders}}
  template:
    metadata:
      labels: {app: orders}
      annotations: {handoff.dev/inject: "true", handoff.dev/fallback: %s}
    spec:
      containers: [{name: worker, image: orders:1}]
`

func runInject(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := injectCommand()
	cmd.SilenceUsage = true // as under the root command
	var out, errOut bytes.Buffer
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

func TestInjectCommand(t *testing.T) {
	out, log, err := runInject(t, strings.Replace(deployment, "%s", "cancel", 1), "--image", "handoff:test")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"name: handoff-install", "image: handoff:test", "value: cancel", "handoff.dev/status: injected", "handoff.dev/version: " + version.Get()} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(log, "injected Deployment orders") {
		t.Errorf("stderr %q does not say what was injected", log)
	}
}

// A pod template that asks for the service account token in every
// container is injected, with the admission webhook's warning on stderr;
// others give the token to the sidecar alone, without a warning.
func TestInjectCommandWarnsOfATokenInEveryContainer(t *testing.T) {
	on := strings.Replace(strings.Replace(deployment, "%s", "cancel", 1), "containers:", "automountServiceAccountToken: true\n      containers:", 1)
	out, log, err := runInject(t, on, "--image", "handoff:test")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "automountServiceAccountToken: true") || strings.Contains(out, "handoff-api-token") {
		t.Errorf("output changed the pod's own token setting:\n%s", out)
	}
	if want := "warning: Deployment orders: spec.automountServiceAccountToken true: every container of the pod holds the service account's token"; !strings.Contains(log, want) {
		t.Errorf("stderr %q lacks %q", log, want)
	}
	out, log, err = runInject(t, strings.Replace(deployment, "%s", "cancel", 1), "--image", "handoff:test")
	if err != nil || strings.Contains(log, "warning") || !strings.Contains(out, "automountServiceAccountToken: false") || !strings.Contains(out, "name: handoff-api-token") {
		t.Errorf("a template without the field: %v, stderr %q, output:\n%s", err, log, out)
	}
}

func TestInjectCommandRefusesAndWritesNothing(t *testing.T) {
	out, _, err := runInject(t, strings.Replace(deployment, "%s", "drop", 1))
	if err == nil || !strings.Contains(err.Error(), "Deployment orders: ") || !strings.Contains(err.Error(), `"drop" for annotation handoff.dev/fallback`) ||
		!strings.Contains(err.Error(), "one of return, cancel, abandon") {
		t.Errorf("error %v: want the object, the annotation and the accepted form named", err)
	}
	if out != "" {
		t.Errorf("wrote %q despite the error", out)
	}
}

func TestInjectCommandDiff(t *testing.T) {
	f := filepath.Join(t.TempDir(), "deploy.yaml")
	if err := os.WriteFile(f, []byte(strings.Replace(deployment, "%s", "return", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err := runInject(t, "", "--diff", "-f", f)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "--- before\n+++ injected\n") || !strings.Contains(out, "+        name: handoff-install") {
		t.Errorf("diff:\n%s", out)
	}
	// Only additions: the input's own lines, formatted differently, are not
	// shown as changed. A list item's first key may move under an added
	// key that sorts before it (env before image): that line's "- " is
	// then on the added key, and the line itself comes back unmarked.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "-") && !strings.HasPrefix(line, "---") {
			body := strings.TrimPrefix(line, "-")
			item := strings.TrimLeft(body, " ")
			indent := body[:len(body)-len(item)]
			if rest, ok := strings.CutPrefix(item, "- "); ok && strings.Contains(out, "\n+"+indent+"  "+rest+"\n") {
				continue
			}
			t.Errorf("diff removes %q", line)
		}
	}
}

func TestInjectCommandRejectsBadFlags(t *testing.T) {
	_, _, err := runInject(t, "", "--sidecar-memory-limit", "lots", "--image-pull-policy", "Sometimes")
	if err == nil || !strings.Contains(err.Error(), "--sidecar-memory-limit") || !strings.Contains(err.Error(), "--image-pull-policy") {
		t.Errorf("error %v: want both flags named", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		// The API server would refuse the pods: a request above the limit, a negative quantity.
		{[]string{"--sidecar-memory-request", "256Mi"}, "--sidecar-memory-request 256Mi is above --sidecar-memory-limit 128Mi: want a request at most the limit"},
		{[]string{"--sidecar-cpu-request", "-10m"}, `--sidecar-cpu-request "-10m": want a quantity from 0`},
		{[]string{"--image", ""}, "--image: want an image reference, like " + defaultImage()},
	} {
		if _, _, err := runInject(t, strings.Replace(deployment, "%s", "cancel", 1), tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v; want %q", tc.args, err, tc.want)
		}
	}
	// A request equal to the limit, or with no limit, is the API server's to accept.
	for _, args := range [][]string{{"--sidecar-memory-request", "128Mi"}, {"--sidecar-memory-request", "256Mi", "--sidecar-memory-limit", ""}} {
		if _, _, err := runInject(t, strings.Replace(deployment, "%s", "cancel", 1), args...); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

func TestInstallCopiesThisBinary(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "handoff")
	cmd := installCommand()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetArgs([]string{dst})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	a, err1 := os.Stat(self)
	b, err2 := os.Stat(dst)
	if err1 != nil || err2 != nil || a.Size() != b.Size() || b.Mode().Perm() != 0o755 {
		t.Errorf("installed %v (%v), want a 0755 copy of %s (%v)", b, err2, self, err1)
	}
}

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

// The injector's default image is the sidecar image of this build's
// version, and a development build's --image help says that no registry
// has it.
func TestDefaultImageIsThisVersionsSidecar(t *testing.T) {
	if got, want := defaultImage(), "ghcr.io/handoff-dev/handoff-sidecar:"+version.Get(); got != want {
		t.Errorf("default image %s, want %s", got, want)
	}
	if v := version.Get(); !version.Released(v) && !strings.Contains(imageUsage(), v+" is a development build") {
		t.Errorf("--image help of the development build %s: %q; want it to say so", v, imageUsage())
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
	inject.Stdin = strings.NewReader(strings.Replace(deployment, "%s", "cancel", 1))
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

// TestInjectNamesTheFileOfAnError: with several -f files, each error names
// its file and counts documents and lines in it, and nothing is written.
func TestInjectNamesTheFileOfAnError(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte(strings.Replace(deployment, "%s", "cancel", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The second document of bad.yaml: a fallback not in the accepted set.
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n"+strings.Replace(deployment, "%s", "drop", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runInject(t, "", "-f", good, "-f", bad)
	if err == nil || !strings.Contains(err.Error(), bad+": ") || strings.Contains(err.Error(), good) {
		t.Fatalf("inject -f good -f bad = %v, want an error naming %s alone", err, bad)
	}
	if !strings.Contains(err.Error(), `"drop"`) {
		t.Errorf("error %v does not name the bad value", err)
	}
	if out != "" {
		t.Errorf("inject wrote %q with an error", out)
	}
	// Two good files: both injected, one stream.
	out, _, err = runInject(t, "", "-f", good, "-f", good)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "name: handoff\n"); n < 2 {
		t.Errorf("two injected files gave %d sidecars in:\n%s", n, out)
	}
}
