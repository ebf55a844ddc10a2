package conformance_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/conformance"
	"github.com/handoff-dev/handoff/internal/sockettest"
)

// fixtureEnv, set, makes the test binary the fixture command: it sends its
// step to the control server at that URL and prints the answer.
const fixtureEnv = "HANDOFF_CONFORMANCE_TEST_FIXTURE"

func TestMain(m *testing.M) {
	if base := os.Getenv(fixtureEnv); base != "" {
		os.Exit(fixtureClient(base, os.Args[len(os.Args)-2:]))
	}
	os.Exit(m.Run())
}

// fixtureClient sends step and arg ("-" for none) as GET base/step?arg=.
func fixtureClient(base string, words []string) int {
	resp, err := http.Get(base + "/" + words[0] + "?arg=" + url.QueryEscape(words[1]))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(os.Stderr, "%s: %s\n", resp.Status, b)
		return 1
	}
	fmt.Print(string(b))
	return 0
}

// control serves the fixture's steps for fixtureClient.
func control(app *goApp, leader conformance.LeaderFixture) http.Handler {
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "no"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, arg := r.Context(), r.URL.Query().Get("arg")
		var out string
		var err error
		switch r.URL.Path {
		case "/restart":
			err = app.Restart(ctx)
		case "/hold":
			var n int
			if n, err = strconv.Atoi(arg); err == nil {
				err = app.Hold(ctx, n)
			}
		case "/hold-cancelable":
			var n int
			if n, err = strconv.Atoi(arg); err == nil {
				err = app.HoldCancelable(ctx, n)
			}
		case "/hold-unstarted":
			var n int
			if n, err = strconv.Atoi(arg); err == nil {
				err = app.HoldUnstarted(ctx, n)
			}
		case "/finish":
			err = app.Finish(ctx)
		case "/lead":
			var ok bool
			ok, err = leader.Lead(ctx, arg)
			out = yes(ok)
		case "/stopping":
			var ok bool
			ok, err = leader.Stopping(ctx, arg)
			out = yes(ok)
		case "/release":
			err = leader.Release(ctx, arg)
		default:
			http.NotFound(w, r)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, out)
	})
}

// The fixture as a command, the way handoff conformance --fixture-cmd and
// --leader-cmd run one for an app in another process: the Go worker
// passes every case through it too.
func TestCommandFixture(t *testing.T) {
	app := newGoApp(t)
	appURL := serveApp(t, app)
	ctl := httptest.NewServer(control(app, conformance.AgentLeader(app.current)))
	defer ctl.Close()
	// The step's words follow Argv; "hold N" has its argument, the others
	// get "-" so that the client always reads two words.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fx := conformance.CommandFixture{Argv: []string{"sh", "-c", `if [ $# -eq 1 ]; then set -- "$1" -; fi; exec "$0" "$@"`, self},
		Env: append(os.Environ(), fixtureEnv+"="+ctl.URL)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep := conformance.Run(ctx, conformance.Target{URL: appURL, Token: testToken, Fixture: fx, Leader: fx})
	t.Logf("\n%s", rep)
	if rep.Count(conformance.Pass) != len(rep.Cases) {
		t.Fatalf("want every case passed through the fixture command:\n%s", rep)
	}
	// A step the command fails is the case's failure, with its stderr.
	bad := conformance.CommandFixture{Argv: []string{"sh", "-c", `echo no such fixture >&2; exit 3`}, Name: "./fixture.sh"}
	rep = conformance.Run(ctx, conformance.Target{URL: appURL, Token: testToken, Fixture: bad})
	if c, _ := rep.Case("stop-claiming/answers-stopping"); c.Result != conformance.Fail {
		t.Fatalf("%s with a failing fixture command = %s (%s), want fail", c.Name, c.Result, c.Reason)
	}
	if c, _ := rep.Case("stop-claiming/answers-stopping"); !contains(c.Reason, "no such fixture") {
		t.Fatalf("reason %q, want the command's stderr", c.Reason)
	}
	if c, _ := rep.Case("stop-claiming/answers-stopping"); !contains(c.Reason, `fixture command "./fixture.sh"`) {
		t.Fatalf("reason %q, want the command named as given (Name), not %q", c.Reason, "sh")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// An app in another language: testdata/app.py, a Python app written from
// docs/protocol.md, passes every case that needs no fixture (it holds no
// claims and does no leader work).
func TestPythonApp(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on this machine")
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(sockettest.Dir(t), "app.sock")
	cmd := exec.Command(python, filepath.Join("testdata", "app.py"), sock, tokenFile)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var listening string
	if _, err := fmt.Fscanf(out, "listening %s\n", &listening); err != nil || listening != sock {
		t.Fatalf("app.py did not say it listens on %s: %q, %v", sock, listening, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep := conformance.Run(ctx, conformance.Target{URL: "unix://" + sock, Token: testToken})
	t.Logf("\n%s", rep)
	if rep.Failed() || rep.Count(conformance.Pass) < 14 {
		t.Fatalf("want every case that needs no fixture passed:\n%s", rep)
	}
}
