package quickstart_test

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/internal/quickstart"
)

// The README's quickstart is one ```sh block that bash parses, with one
// platform install whose chart, version and namespace come from the
// block's variables, as the e2e suite's setup installs it.
func TestReadmeQuickstart(t *testing.T) {
	q, err := quickstart.Read("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, script := range map[string]string{"the block": q.Script, "the block without the platform install": q.Rest} {
		if out, err := exec.Command("bash", "-n", "-c", script).CombinedOutput(); err != nil {
			t.Errorf("bash -n on %s: %v\n%s", name, err, out)
		}
	}
	if strings.Contains(q.Rest, "helm install handoff ") {
		t.Errorf("Rest still installs the platform's chart:\n%s", q.Rest)
	}
	if !strings.Contains(q.Rest, "kubectl handoff status") {
		t.Errorf("the quickstart does not show a rollout with kubectl handoff status:\n%s", q.Script)
	}

	args, err := q.PlatformInstallArgs(context.Background(), []string{"HANDOFF_VERSION=v9.8.7", "HANDOFF_CHARTS=oci://registry.example/charts"})
	if err != nil {
		t.Fatal(err)
	}
	if len(args) < 3 || args[2] != "oci://registry.example/charts/handoff" || !hasFlag(args, "--version", "v9.8.7") ||
		!hasFlag(args, "--namespace", "handoff") || !slices.Contains(args, "--create-namespace") || !slices.Contains(args, "--wait") {
		t.Errorf("with HANDOFF_VERSION and HANDOFF_CHARTS set, the platform install is helm %q; want install handoff $HANDOFF_CHARTS/handoff --version $HANDOFF_VERSION --namespace handoff --create-namespace --wait", args)
	}
	// Unset, the variables name the project's releases.
	args, err = q.PlatformInstallArgs(context.Background(), []string{"HANDOFF_VERSION=", "HANDOFF_CHARTS="})
	if err != nil {
		t.Fatal(err)
	}
	if len(args) < 3 || args[2] != "oci://ghcr.io/handoff-dev/charts/handoff" {
		t.Errorf("by default the platform install is helm %q; want the chart oci://ghcr.io/handoff-dev/charts/handoff", args)
	}
}

// hasFlag says whether args hold flag followed by value.
func hasFlag(args []string, flag, value string) bool {
	i := slices.Index(args, flag)
	return i >= 0 && i+1 < len(args) && args[i+1] == value
}

func TestParse(t *testing.T) {
	const install = "helm install handoff \"$C/handoff\" \\\n  --version \"$V\"\n"
	for _, tc := range []struct {
		name, readme string
		rest, err    string
	}{
		{name: "block", readme: "# x\n\n<!-- quickstart -->\n\n```sh\nV=${V:-v1}\n" + install + "kubectl get pods\n```\n",
			rest: "V=${V:-v1}\nkubectl get pods\n"},
		{name: "no marker", readme: "```sh\n" + install + "```\n", err: "no line <!-- quickstart -->"},
		{name: "no block", readme: "<!-- quickstart -->\ntext\n```sh\n" + install + "```\n", err: "not followed by a ```sh block"},
		{name: "not closed", readme: "<!-- quickstart -->\n```sh\n" + install, err: "not closed"},
		{name: "no install", readme: "<!-- quickstart -->\n```sh\nkubectl get pods\n```\n", err: "no line starting"},
		{name: "two installs", readme: "<!-- quickstart -->\n```sh\n" + install + install + "```\n", err: "two commands"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := quickstart.Parse(tc.readme)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Parse: %v; want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if q.PlatformInstall != install || q.Rest != tc.rest {
				t.Errorf("PlatformInstall %q, Rest %q; want %q, %q", q.PlatformInstall, q.Rest, install, tc.rest)
			}
			args, err := q.PlatformInstallArgs(context.Background(), []string{"C=oci://r/charts", "V="})
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{"install", "handoff", "oci://r/charts/handoff", "--version", "v1"}; !slices.Equal(args, want) {
				t.Errorf("PlatformInstallArgs = %q; want %q", args, want)
			}
		})
	}
}
