package inject

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/internal/cli/clitest"

	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/injectflags"
	"github.com/handoff-dev/handoff/version"
)

func runInject(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = command.Execute(context.Background(), Command, args, strings.NewReader(stdin), &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestInjectCommand(t *testing.T) {
	out, log, err := runInject(t, clitest.Deployment("cancel"), "--image", "handoff:test")
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
	on := strings.Replace(clitest.Deployment("cancel"), "containers:", "automountServiceAccountToken: true\n      containers:", 1)
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
	out, log, err = runInject(t, clitest.Deployment("cancel"), "--image", "handoff:test")
	if err != nil || strings.Contains(log, "warning") || !strings.Contains(out, "automountServiceAccountToken: false") || !strings.Contains(out, "name: handoff-api-token") {
		t.Errorf("a template without the field: %v, stderr %q, output:\n%s", err, log, out)
	}
}

func TestInjectCommandRefusesAndWritesNothing(t *testing.T) {
	out, _, err := runInject(t, clitest.Deployment("drop"))
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
	if err := os.WriteFile(f, []byte(clitest.Deployment("return")), 0o600); err != nil {
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
		{[]string{"--image", ""}, "--image: want an image reference, like " + injectflags.DefaultImage()},
	} {
		if _, _, err := runInject(t, clitest.Deployment("cancel"), tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v; want %q", tc.args, err, tc.want)
		}
	}
	// A request equal to the limit, or with no limit, is the API server's to accept.
	for _, args := range [][]string{{"--sidecar-memory-request", "128Mi"}, {"--sidecar-memory-request", "256Mi", "--sidecar-memory-limit", ""}} {
		if _, _, err := runInject(t, clitest.Deployment("cancel"), args...); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestInjectNamesTheFileOfAnError: with several -f files, each error names
// its file and counts documents and lines in it, and nothing is written.
func TestInjectNamesTheFileOfAnError(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte(clitest.Deployment("cancel")), 0o644); err != nil {
		t.Fatal(err)
	}
	// The second document of bad.yaml: a fallback not in the accepted set.
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n"+clitest.Deployment("drop")), 0o644); err != nil {
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
