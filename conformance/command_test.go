package conformance_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/conformance"
	"github.com/handoff-dev/handoff/internal/sockettest"
	"github.com/handoff-dev/handoff/protocol"
)

// fixtureEnv, set, makes the test binary the fixture command
// (conformance.FixtureMain of its arguments); workerEnv, set, makes it the
// worker under test: a goApp serving the app API on $HANDOFF_APP_URL and
// its fixture steps on $HANDOFF_FIXTURE_SOCKET (conformance.ServeFixture).
const (
	fixtureEnv = "HANDOFF_CONFORMANCE_TEST_FIXTURE"
	workerEnv  = "HANDOFF_CONFORMANCE_TEST_WORKER"
)

func TestMain(m *testing.M) {
	if os.Getenv(fixtureEnv) != "" {
		os.Exit(conformance.FixtureMain(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	if os.Getenv(workerEnv) != "" {
		if err := workerMain(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// workerMain is the worker process of TestCommandFixture: a goApp, as a
// Go worker serves the fixture's steps under handoff conformance.
func workerMain() error {
	ctx := context.Background()
	app := &goApp{}
	if err := app.Restart(ctx); err != nil {
		return err
	}
	e, err := protocol.ParseEndpoint(os.Getenv("HANDOFF_APP_URL"))
	if err != nil {
		return err
	}
	ln, err := e.Listen(ctx)
	if err != nil {
		return err
	}
	go func() { _ = (&http.Server{Handler: app, ReadHeaderTimeout: 5 * time.Second}).Serve(ln) }()
	fln, err := net.Listen("unix", os.Getenv(conformance.FixtureSocketEnv))
	if err != nil {
		return err
	}
	return conformance.ServeFixture(ctx, fln, app, conformance.AgentLeader(app.current))
}

// The fixture as a command, the way handoff conformance --fixture-cmd and
// --leader-cmd run one for an app in another process: the Go SDK's own
// fixture (conformance.FixtureMain starting the worker, which serves its
// steps with conformance.ServeFixture) passes every case, the worker a
// process of its own.
func TestCommandFixture(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := sockettest.Dir(t)
	appURL := "unix://" + filepath.Join(dir, "app.sock")
	worker := fmt.Sprintf("env %s= %s=1 HANDOFF_APP_URL=%s '%s'", fixtureEnv, workerEnv, appURL, self)
	fx := conformance.CommandFixture{Argv: []string{self, "--dir", dir, "--worker", worker}, Env: append(os.Environ(), fixtureEnv+"=1"), Name: "fixture"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	defer func() {
		if conformance.RunFixture(ctx, dir, worker, []string{"stop"}, io.Discard, os.Stderr) != 0 {
			t.Error("the fixture's stop failed")
		}
	}()
	rep := conformance.Run(ctx, conformance.Target{URL: appURL, Token: testToken, Fixture: fx, Leader: fx})
	t.Logf("\n%s", rep)
	if rep.Count(conformance.Pass) != len(rep.Cases) {
		log, _ := os.ReadFile(filepath.Join(dir, "worker.log"))
		t.Fatalf("want every case passed through the fixture command:\n%s\nworker.log:\n%s", rep, log)
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

// ServeFixture and RunFixture step by step, on an app that restarts itself
// in its process: what each step answers, prints and exits with.
func TestServeFixture(t *testing.T) {
	app := newGoApp(t)
	dir := sockettest.Dir(t)
	ln, err := net.Listen("unix", filepath.Join(dir, "fixture.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- conformance.ServeFixture(ctx, ln, app, conformance.AgentLeader(app.current)) }()
	run := func(words ...string) (int, string, string) {
		var out, errOut strings.Builder
		code := conformance.RunFixture(context.Background(), dir, "", words, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	want := func(words string, code int, out, errPart string) {
		t.Helper()
		c, o, e := run(strings.Fields(words)...)
		if c != code || o != out || !strings.Contains(e, errPart) || (errPart == "" && e != "") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr with %q", words, c, o, e, code, out, errPart)
		}
	}
	before := app.current()
	want("restart", 0, "", "")
	if app.current() == before {
		t.Error("restart without a worker command: the app did not restart")
	}
	want("hold 2", 0, "", "")
	if n := app.current().InFlight(); n != 2 {
		t.Errorf("after hold 2: inFlight %d, want 2", n)
	}
	want("finish", 0, "", "")
	if n := app.current().InFlight(); n != 0 {
		t.Errorf("after finish: inFlight %d, want 0", n)
	}
	want("hold x", 1, "", `hold x: hold N must be an integer >= 1, got "x"`)
	want("hold-unstarted 0", 1, "", "N must be an integer >= 1")
	want("lead L", 0, "no\n", "")
	want("stopping L", 0, "no\n", "")
	want("release L", 0, "", "")
	want("lead", 1, "", "lead needs a Lease name")
	want("frobnicate 1", 1, "", `unknown step "frobnicate 1"`)
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("ServeFixture after its context ended: %v", err)
	}
	want("finish", 1, "", "handoff fixture finish: ") // nothing serves
	// A Fixture that cannot hold claims unstarted or cancelable says so.
	ln, err = net.Listen("unix", filepath.Join(dir, "fixture.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = conformance.ServeFixture(ctx, ln, struct{ conformance.Fixture }{app}, nil) }()
	want("hold-unstarted 1", 0, "unsupported\n", "")
	want("hold-cancelable 1", 0, "unsupported\n", "")
	want("lead L", 1, "", "serves no LeaderFixture")
	var errOut strings.Builder
	if code := conformance.FixtureMain(context.Background(), []string{"--dir", dir, "hold"}, io.Discard, &errOut); code != 2 || !contains(errOut.String(), "usage:") {
		t.Errorf("FixtureMain with hold and no N: exit %d, stderr %q; want 2 and the usage", code, errOut.String())
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
