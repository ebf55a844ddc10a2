package conformance

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/conformance"
	"github.com/handoff-dev/handoff/internal/cli/clitest"
	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/sockettest"
)

// runConformance runs handoff conformance with args and returns its
// output and error.
func runConformance(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out strings.Builder
	err := command.Execute(context.Background(), Command, args, nil, &out, &out)
	return out.String(), err
}

// handoff conformance against the Go worker passes (the cases that need a
// fixture skipped), and against an app that answers 200 to anything fails,
// printing the cases that failed.
func TestConformanceCommand(t *testing.T) {
	file, _, agent := clitest.TokenAgent(t)
	// The Go worker as an injected pod runs it: on its app socket.
	sock := sockettest.Dir(t)
	good := "unix://" + filepath.Join(sock, "app.sock")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- agent.ListenAndServe(ctx, good) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ListenAndServe: %v", err)
		}
	}()
	for i := 0; ; i++ {
		if _, err := os.Stat(filepath.Join(sock, "app.sock")); err == nil || i > 500 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	out, err := runConformance(t, "--app-url", good, "--token-file", file)
	t.Logf("\n%s", out)
	if err != nil {
		t.Fatalf("conformance of the Go worker: %v", err)
	}
	for _, want := range []string{"pass  auth/unsigned-refused", "pass  auth/replay-refused", "skip  return/counts", "0 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}

	yes := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"leader": true, "stopping": true}`))
	}))
	defer yes.Close()
	out, err = runConformance(t, "--app-url", yes.URL, "--token-file", file)
	t.Logf("\n%s", out)
	if err == nil || !strings.Contains(err.Error(), "does not conform") {
		t.Fatalf("conformance of an app answering 200 to anything: %v, want an error", err)
	}
	if !strings.Contains(out, "fail  auth/unsigned-refused") {
		t.Errorf("output lacks the unsigned case's failure")
	}
	// -o json: the same cases, as one JSON object, and the same exit status.
	out, err = runConformance(t, "--app-url", yes.URL, "--token-file", file, "-o", "json")
	var js struct {
		Cases  []struct{ Name, Result string }
		Failed int
	}
	first, _, _ := strings.Cut(out, "\n") // then cobra's error
	if jerr := json.Unmarshal([]byte(first), &js); err == nil || jerr != nil || js.Failed == 0 || len(js.Cases) != len(conformance.Cases()) || js.Cases[0].Name != conformance.Cases()[0] {
		t.Errorf("conformance -o json of an app answering 200 to anything: %v, %v, %d cases, %d failed\n%s", err, jerr, len(js.Cases), js.Failed, out)
	}
	// -o junit: JUnit XML with the failures, and the same exit status.
	out, err = runConformance(t, "--app-url", yes.URL, "--token-file", file, "-o", "junit")
	if err == nil || !strings.HasPrefix(out, "<?xml") || !strings.Contains(out, `<testcase classname="handoff.conformance.auth" name="auth/unsigned-refused"`) ||
		!strings.Contains(out, "<failure message=") {
		t.Errorf("conformance -o junit of an app answering 200 to anything: %v\n%s", err, out)
	}

	// A fixture command that fails fails the cases that need it.
	out, err = runConformance(t, "--app-url", good, "--token-file", file, "--fixture-cmd", "echo cannot hold >&2; exit 2")
	if err == nil || !strings.Contains(out, "fail  return/counts") || !strings.Contains(out, "cannot hold") {
		t.Fatalf("with a failing --fixture-cmd: %v\n%s", err, out)
	}
}

func TestConformanceCommandRefusesBadFlags(t *testing.T) {
	file := clitest.TokenFile(t)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--app-url", "http://10.0.0.1:7452", "--token-file", file}, "--app-url"},
		{[]string{"--app-url", "unix://app.sock", "--token-file", file}, "not absolute"},
		{[]string{"--app-url", "http://127.0.0.1:7452/?x=1", "--token-file", file}, "no user, path, query or fragment"},
		{[]string{"--token-file", t.TempDir() + "/none"}, "token file"},
		{[]string{"--token-file", file, "--lease-duration", "2h"}, "--lease-duration"},
		{[]string{"--token-file", file, "--timeout", "0s"}, "--timeout"},
		{[]string{"--token-file", file, "-o", "xml"}, `--output "xml": want text, json or junit`},
	} {
		_, err := runConformance(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("conformance %q: %v, want an error saying %q", tc.args, err, tc.says)
		}
	}
}

// handoff conformance --list prints every case of the table, a line each
// with its group and the rule's anchor, or the same as JSON, and runs none
// (no app is reachable at the default address here: a run would fail).
func TestConformanceListPrintsTheTable(t *testing.T) {
	cases := conformance.Catalog()
	if len(cases) == 0 {
		t.Fatal("conformance.Catalog is empty")
	}
	out, err := runConformance(t, "--list")
	if err != nil {
		t.Fatalf("conformance --list: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(cases) {
		t.Errorf("conformance --list printed %d lines, want one a case (%d)", len(lines), len(cases))
	}
	for i, c := range cases {
		if i < len(lines) && (!strings.HasPrefix(lines[i], c.ID+" ") || !strings.Contains(lines[i], c.Group) || !strings.Contains(lines[i], c.Anchor)) {
			t.Errorf("line %d %q: want case %s, group %s, anchor %s", i, lines[i], c.ID, c.Group, c.Anchor)
		}
	}
	out, err = runConformance(t, "--list", "-o", "json")
	if err != nil {
		t.Fatalf("conformance --list -o json: %v\n%s", err, out)
	}
	var got struct{ Cases []conformance.CaseInfo }
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Cases) != len(cases) || got.Cases[0] != cases[0] {
		t.Errorf("conformance --list -o json: %v, %d cases (first %+v); want the %d cases of Catalog", err, len(got.Cases), got.Cases, len(cases))
	}
	if _, err := runConformance(t, "--list", "-o", "junit"); err == nil || !strings.Contains(err.Error(), "with --list") {
		t.Errorf("conformance --list -o junit: %v, want an error naming --list", err)
	}
}
