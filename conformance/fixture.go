package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The fixture contract's app side for Go (docs/protocol.md, "The fixture
// contract"; CommandFixture is the suite's side): ServeFixture serves the
// steps of a Fixture and a LeaderFixture in the app's process, and
// RunFixture (FixtureMain) is the fixture command handoff conformance runs,
// which starts the worker at restart and passes every other step to it.
// Between them runs the SDKs' own wire, the same in every SDK (Go, Python's
// handoff.testing, Node's @handoff-dev/worker/testing, Ruby's Handoff::Testing),
// so that any SDK's fixture command drives any SDK's worker: a Unix socket,
// one connection per step, the step's words joined by single spaces and
// "\n" in, one line out, written once the step is done: "ok" (done, nothing
// to print), "yes", "no", "unsupported", or "error: " and why.

// FixtureSocketEnv is the environment variable naming the Unix socket the
// worker under test serves its fixture steps on (ServeFixture): RunFixture
// sets it for the worker it starts, to DIR/fixture.sock.
const FixtureSocketEnv = "HANDOFF_FIXTURE_SOCKET"

// fixtureSocket is the socket's name in RunFixture's directory.
const fixtureSocket = "fixture.sock"

// ServeFixture serves the fixture's steps on ln, one connection a step,
// until ctx ends (it then closes ln and returns nil) or ln fails: hold N
// (f.Hold), hold-cancelable N and hold-unstarted N (f as a CancelFixture
// or an UnstartedFixture; "unsupported" when it is none, or returns an
// error wrapping errors.ErrUnsupported), finish (f.Finish), lead, stopping
// and release LEASE (l), restart (f.Restart: for an app that replaces
// itself in its process; a worker RunFixture starts is restarted by
// RunFixture itself), and ping ("ok"; RunFixture's restart waits for it).
// Each step runs bounded by ctx; a step of a nil f or l, a bad N (an
// integer ≥ 1) or an unknown step answers "error: ...". Serve it once the
// app serves: restart returns once this answers.
func ServeFixture(ctx context.Context, ln net.Listener, f Fixture, l LeaderFixture) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { _ = c.Close() }()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // the step's line; the step itself is bounded by ctx
			line, err := bufio.NewReader(io.LimitReader(c, 4096)).ReadString('\n')
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, fixtureStep(ctx, f, l, strings.Fields(line))+"\n")
		}()
	}
}

// fixtureStep runs one step and returns its answer line.
func fixtureStep(ctx context.Context, f Fixture, l LeaderFixture, words []string) string {
	out, err := runFixtureStep(ctx, f, l, words)
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		return "unsupported"
	case err != nil:
		return "error: " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	return out
}

func runFixtureStep(ctx context.Context, f Fixture, l LeaderFixture, words []string) (string, error) {
	if len(words) == 0 {
		return "", errors.New("empty step")
	}
	cmd, arg := words[0], ""
	if len(words) > 1 {
		arg = words[1]
	}
	yesNo := func(ok bool, err error) (string, error) {
		if err != nil {
			return "", err
		}
		if ok {
			return "yes", nil
		}
		return "no", nil
	}
	switch cmd {
	case "ping":
		return "ok", nil
	case "restart", "hold", "hold-cancelable", "hold-unstarted", "finish":
		if f == nil {
			return "", fmt.Errorf("%s: this app serves no Fixture", cmd)
		}
	case "lead", "stopping", "release":
		if l == nil {
			return "", fmt.Errorf("%s: this app serves no LeaderFixture", cmd)
		}
		if arg == "" {
			return "", fmt.Errorf("%s needs a Lease name", cmd)
		}
	default:
		return "", fmt.Errorf("unknown step %q", strings.Join(words, " "))
	}
	n := 0
	if strings.HasPrefix(cmd, "hold") {
		var err error
		if n, err = strconv.Atoi(arg); err != nil || n < 1 {
			return "", fmt.Errorf("%s N must be an integer >= 1, got %q", cmd, arg)
		}
	}
	switch cmd {
	case "restart":
		return "ok", f.Restart(ctx)
	case "hold":
		return "ok", f.Hold(ctx, n)
	case "hold-cancelable":
		cf, ok := f.(CancelFixture)
		if !ok {
			return "", errors.ErrUnsupported
		}
		return "ok", cf.HoldCancelable(ctx, n)
	case "hold-unstarted":
		uf, ok := f.(UnstartedFixture)
		if !ok {
			return "", errors.ErrUnsupported
		}
		return "ok", uf.HoldUnstarted(ctx, n)
	case "finish":
		return "ok", f.Finish(ctx)
	case "lead":
		return yesNo(l.Lead(ctx, arg))
	case "stopping":
		return yesNo(l.Stopping(ctx, arg))
	}
	return "ok", l.Release(ctx, arg)
}

// RunFixture runs one step of the fixture contract as the fixture command
// (handoff conformance --fixture-cmd and --leader-cmd) and returns its exit
// status: 0, or 1 with the reason on stderr. dir is the command's own: the
// worker's process ID (worker.pid), its log (worker.log) and its socket
// (fixture.sock). worker is the worker's command, a shell command line run
// as sh -c 'exec WORKER'; with a worker, restart kills the worker started
// last (SIGKILL, as a container is killed; its process group) and starts a
// fresh one with $HANDOFF_FIXTURE_SOCKET set and the command's
// environment, stdin /dev/null and its output appended to the log, and
// returns once the socket answers (within 20 s); stop stops it (SIGTERM,
// then SIGKILL after 5 s). Without a worker (an app that restarts itself,
// in a process of its own) every step, restart too, goes to the socket.
// "yes", "no" and "unsupported" are printed on stdout.
func RunFixture(ctx context.Context, dir, worker string, words []string, stdout, stderr io.Writer) int {
	if err := runFixture(ctx, dir, worker, words, stdout); err != nil {
		_, _ = fmt.Fprintf(stderr, "handoff fixture %s: %v\n", strings.Join(words, " "), err)
		return 1
	}
	return 0
}

func runFixture(ctx context.Context, dir, worker string, words []string, stdout io.Writer) error {
	switch {
	case len(words) == 0:
		return errors.New("no step given")
	case worker != "" && words[0] == "restart":
		return restartWorker(ctx, dir, worker, 20*time.Second)
	case words[0] == "stop":
		return stopWorker(dir, true)
	}
	answer, err := sendFixtureStep(ctx, filepath.Join(dir, fixtureSocket), words, time.Minute)
	if err != nil {
		return err
	}
	switch {
	case answer == "ok":
	case answer == "yes" || answer == "no" || answer == "unsupported":
		_, _ = fmt.Fprintln(stdout, answer)
	case strings.HasPrefix(answer, "error: "):
		return errors.New(strings.TrimPrefix(answer, "error: "))
	case answer == "":
		return errors.New("no answer")
	default:
		return fmt.Errorf("answer %q", answer)
	}
	return nil
}

func sendFixtureStep(ctx context.Context, sock string, words []string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", sock)
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	if _, err := io.WriteString(c, strings.Join(words, " ")+"\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	return strings.TrimSpace(line), nil // "" at an EOF with nothing: no answer
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil && !dirExists("/proc/self")
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) == 0 || f[0] != "Z"
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

func stopWorker(dir string, graceful bool) error {
	pidFile := filepath.Join(dir, "worker.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return nil // none started
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return fmt.Errorf("%s: not a process ID: %q", pidFile, b)
	}
	sigs := []syscall.Signal{syscall.SIGKILL}
	if graceful {
		sigs = []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}
	}
	for _, sig := range sigs {
		if syscall.Kill(-pid, sig) != nil && syscall.Kill(pid, sig) != nil {
			break // gone
		}
		for end := time.Now().Add(5 * time.Second); alive(pid) && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
		}
		if !alive(pid) {
			break
		}
	}
	if alive(pid) {
		return fmt.Errorf("worker %d still running 5s after SIGKILL", pid)
	}
	return os.Remove(pidFile)
}

func restartWorker(ctx context.Context, dir, worker string, startTimeout time.Duration) error {
	if err := stopWorker(dir, false); err != nil {
		return err
	}
	sock := filepath.Join(dir, fixtureSocket)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	logPath := filepath.Join(dir, "worker.log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	cmd := exec.Command("/bin/sh", "-c", "exec "+worker)
	cmd.Env = append(os.Environ(), FixtureSocketEnv+"="+sock)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the worker: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if err := os.WriteFile(filepath.Join(dir, "worker.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(startTimeout)
	for {
		if answer, err := sendFixtureStep(ctx, sock, []string{"ping"}, time.Second); err == nil && answer == "ok" {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the worker exited at start (%w): see %s", err, logPath)
		case <-deadline:
			return fmt.Errorf("the worker did not answer on %s within %s: see %s", sock, startTimeout, logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// FixtureMain is RunFixture's command line, for a fixture command of the
// app's own: args are "--dir DIR [--worker CMD] STEP [ARG]" (handoff
// conformance appends the step), and it returns the exit status (2: a
// usage error).
func FixtureMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var dir, worker string
	for len(args) > 1 && strings.HasPrefix(args[0], "--") {
		switch args[0] {
		case "--dir":
			dir = args[1]
		case "--worker":
			worker = args[1]
		default:
			_, _ = fmt.Fprintf(stderr, "handoff fixture: unknown option %s\n%s", args[0], fixtureUsage)
			return 2
		}
		args = args[2:]
	}
	ok := len(args) == 1 && (args[0] == "restart" || args[0] == "finish" || args[0] == "stop") ||
		len(args) == 2 && slices.Contains([]string{"hold", "hold-cancelable", "hold-unstarted", "lead", "stopping", "release"}, args[0])
	if dir == "" || !ok {
		_, _ = io.WriteString(stderr, fixtureUsage)
		return 2
	}
	return RunFixture(ctx, dir, worker, args, stdout, stderr)
}

const fixtureUsage = `usage: --dir DIR [--worker 'WORKER COMMAND'] STEP [ARG]
The fixture command of handoff conformance (--fixture-cmd, --leader-cmd):
STEP is restart, hold N, hold-cancelable N, hold-unstarted N, finish,
lead LEASE, stopping LEASE, release LEASE, or stop.
`
