// The layout of the CLI, as the imports draw it (docs/architecture.md): one
// package a command under internal/cli, helpers shared by several commands
// beside them, cmd/ the only place that puts commands together.
package cli_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/handoff-dev/handoff/"

// commands are the packages of internal/cli that are one command each;
// every other package there is a helper the commands share.
var commands = []string{"check", "conformance", "inject", "install", "prestop", "sidecar", "status", "version", "webhook"}

// No import runs back up: nothing imports cmd/, a helper imports no
// command, and a command imports no other command (version's report, which
// both binaries' version commands print, is the helper version/client).
func TestImportsRunOneWay(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "../../...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	command := func(pkg string) string {
		rest, ok := strings.CutPrefix(pkg, module+"internal/cli/")
		if !ok {
			return ""
		}
		name, _, _ := strings.Cut(rest, "/")
		if !slices.Contains(commands, name) || rest == "version/client" {
			return ""
		}
		return name
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := fields[0]
		if strings.HasPrefix(pkg, module+"internal/cli/") {
			seen++
		}
		for _, imp := range fields[1:] {
			switch {
			case strings.HasPrefix(imp, module+"cmd/"):
				t.Errorf("%s imports %s: nothing imports a binary's main package", pkg, imp)
			case strings.HasPrefix(pkg, module+"cmd/"):
			case command(imp) != "" && command(imp) != command(pkg):
				t.Errorf("%s imports the command package %s: share it through a helper package of internal/cli, or put the commands together in cmd/", pkg, imp)
			}
		}
	}
	if seen < len(commands) {
		t.Fatalf("go list saw %d packages under internal/cli, want at least the %d commands: %s", seen, len(commands), out)
	}
}

// The sidecar's binary, which every injected pod runs, is lean by what it
// imports: no cobra and none of the CLI's or webhook's commands.
func TestSidecarBinaryHasOnlyItsCommands(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../../cmd/handoff-sidecar").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, bad := range []string{"github.com/spf13/cobra", module + "internal/cli/cobracmd", module + "internal/cli/webhook",
		module + "internal/cli/inject", module + "internal/cli/check", module + "internal/cli/status", module + "internal/cli/conformance"} {
		if slices.Contains(deps, bad) {
			t.Errorf("cmd/handoff-sidecar links %s", bad)
		}
	}
}
