package main

import (
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/internal/cli/version/client"
	"github.com/handoff-dev/handoff/version"
)

// TestSidecarBuildLeavesOutTheWebhook: bin/handoff-sidecar (this command),
// which injected pods run, links neither controller-runtime
// nor cert-controller nor the webhook and injector packages (nor
// k8s.io/apiserver, which the webhook's metrics authorization links), whose code and
// init-time data are 4–6 MiB of resident memory, nor zap nor cobra (about
// 1 MiB each; docs/performance.md, Footprint); and it still has every
// command the sidecar and install containers and the preStop hook run,
// with their flags, and refuses what bin/handoff refuses.
func TestSidecarBuildLeavesOutTheWebhook(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"sigs.k8s.io/controller-runtime", "github.com/open-policy-agent/cert-controller",
			"github.com/handoff-dev/handoff/webhook", "github.com/handoff-dev/handoff/inject", "go.uber.org/zap", "github.com/spf13/cobra",
			"k8s.io/apiserver"} {
			if pkg == banned || strings.HasPrefix(pkg, banned+"/") {
				t.Errorf("bin/handoff-sidecar links %s", pkg)
			}
		}
	}
	bin := t.TempDir() + "/handoff-sidecar"
	// Stamped as the Makefile stamps it.
	stamp := version.Info{Version: "v9.8.7-rc.1", Commit: "0123456789abcdef0123456789abcdef01234567", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	ldflags := "-X github.com/handoff-dev/handoff/version.version=" + stamp.Version + " -X github.com/handoff-dev/handoff/version.commit=" + stamp.Commit
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for cmd, flag := range map[string]string{"sidecar": "--renew-deadline", "prestop": "--then-sleep", "install": "--token-file"} {
		if out, err := exec.Command(bin, cmd, "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), flag) {
			t.Errorf("handoff-sidecar %s --help: %v, want the flag %s listed\n%s", cmd, err, flag, out)
		}
	}
	// The client's version as bin/handoff's `version --client` prints it.
	for _, format := range []string{"", "json", "yaml"} {
		var want strings.Builder
		if err := client.Write(&want, client.Report{Client: stamp}, format); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, "version", "-o", format).CombinedOutput(); err != nil || string(out) != want.String() {
			t.Errorf("handoff-sidecar version -o %q: %v\n%s\nwant\n%s", format, err, out, want.String())
		}
	}
	if out, _ := exec.Command(bin, "version").Output(); string(out) != "Client version: v9.8.7-rc.1 (commit 0123456789ab, "+stamp.GoVersion+", "+stamp.Platform+")\n" {
		t.Errorf("handoff-sidecar version: %q, want the stamped version, the commit's first 12 digits, Go and platform", out)
	}
	token := t.TempDir() + "/token"
	if err := os.WriteFile(token, []byte(strings.Repeat("ab", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	pod := []string{"sidecar", "--pod-name", "p", "--pod-namespace", "n", "--token-file", token}
	// Outside a pod, whatever runs the test: no in-cluster configuration.
	outside := slices.DeleteFunc(os.Environ(), func(v string) bool {
		return strings.HasPrefix(v, "KUBERNETES_SERVICE_") || strings.HasPrefix(v, "KUBECONFIG=")
	})
	// kubectl's KUBECONFIG is not handoff's: the error says so.
	cmd := exec.Command(bin, pod...)
	cmd.Env = append(slices.Clone(outside), "KUBECONFIG=/k")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "(flag --kubeconfig or HANDOFF_KUBECONFIG); KUBECONFIG=/k is not read") {
		t.Errorf("handoff-sidecar %s with KUBECONFIG=/k: %v\n%s\nwant a failure saying KUBECONFIG is not read", strings.Join(pod, " "), err, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{slices.Concat(pod, []string{"--kubeconfig", "/nonexistent"}), "kubeconfig: /nonexistent: stat /nonexistent"},
		{pod, "kubeconfig: not set, and not running in a pod (no in-cluster configuration): set a kubeconfig file's path (flag --kubeconfig or HANDOFF_KUBECONFIG)"},
		{[]string{"webhook"}, `unknown command "webhook" for "handoff"`},
		{[]string{"sidecar", "extra"}, `unknown command "extra" for "handoff sidecar"`},
		{[]string{"install", "a", "b"}, "accepts at most 1 arg(s), received 2"},
		{[]string{"install", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"sidecar", "--fallback", "drop", "--token-file", "/nonexistent"}, `invalid value "drop" for flag --fallback`},
		{[]string{"sidecar", "--token-file", "/nonexistent"}, "pod-name: required: a pod name, of the pod this sidecar runs in"},
		{[]string{"sidecar", "--pod-name", "p", "--token-file", "/nonexistent"}, "pod-namespace: required: a namespace name, of the pod this sidecar runs in"},
		{[]string{"prestop", "--addr", "127.0.0.1:1", "--connect-timeout", "100ms", "--token-file", "/nonexistent"}, "/nonexistent"},
		{[]string{"prestop", "stray", "--", "true"}, `unexpected argument "stray"`},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = outside
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("handoff-sidecar %s: %v\n%s\nwant a failure saying %s", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
}

// bin/handoff-sidecar leaves the conformance suite out.
func TestSidecarBuildLeavesOutConformance(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "github.com/handoff-dev/handoff/conformance" {
			t.Errorf("bin/handoff-sidecar links %s", pkg)
		}
	}
}
