// Package servertest is what the packages that give tests a real server
// (internal/pgtest, internal/natstest, internal/redistest,
// internal/rabbittest, internal/kubetest) share, so that each reads the
// same:
//
//   - Run(m) from TestMain: the tests run, and the server, if one was
//     started, is stopped when they end (Setup, for a TestMain that runs
//     the tests another way or gives them two servers);
//   - Get(t) from a test: the server (its address), started on first use:
//     one server per test binary; under go test -short the test is skipped
//     instead (make unit), as it needs a server;
//   - StartServer() from a command (a benchmark): a server of its own, and
//     the func that stops it.
//
// Shared is that shape, one server of a test binary; StartScript starts a
// server with its hack/ script (hack/lib/server.sh: in a temporary
// directory on a free port, with the script's watchdog stopping it should
// the process die); Script finds the module's hack/ scripts; FreePort
// gives a free port.
package servertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Suite names the suite that runs the tests a Get skips under -short, in
// the skip message.
const Suite = "make integration (go test without -short)"

// Shared is the one server of a test binary, of type T: its address (a
// string) or a handle (kubetest's *Env). Name it, set Env and Start; call
// Run (or Setup) from TestMain and Get from the tests.
type Shared[T any] struct {
	// Name is the server's name in errors and skip messages, like "Redis".
	Name string
	// Env names the environment variable with the address of an existing
	// server to use instead; nothing is then started or stopped. Empty:
	// none. Only for T string.
	Env string
	// Start starts a server and returns it and the func that stops it.
	Start func() (server T, stop func(), err error)

	mu      sync.Mutex
	running bool // Run or Setup is running the tests
	started bool // a start was attempted; value and err hold its outcome
	value   T
	err     error
	stop    func()
}

// Run runs the tests of m and then stops the server Get started, if any.
// Call it from TestMain; when TestMain returns, the test binary exits with
// the code of m.Run.
func (s *Shared[T]) Run(m *testing.M) {
	defer s.Setup()()
	m.Run()
}

// Setup is Run for a TestMain that runs the tests itself (or with another
// package's Run, for a second server): it lets Get start the server, and
// returns the func that stops it, to run once the tests are over.
//
//	func TestMain(m *testing.M) {
//		defer pgtest.Setup()()
//		kubetest.Run(m)
//	}
func (s *Shared[T]) Setup() (stop func()) {
	s.mu.Lock()
	s.running = true
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.running = false
		if s.stop != nil {
			s.stop()
			s.stop = nil
		}
	}
}

// Get returns the server, starting it on first use; a failed start is not
// retried. Under go test -short it skips t (make unit runs no server). If
// no server can be had it fails t (it does not skip): a test that needs
// the server must not pass silently without it.
func (s *Shared[T]) Get(t testing.TB) T {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s; skipped under -short, run by %s", s.Name, Suite)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		s.started = true
		switch {
		case s.Env != "" && os.Getenv(s.Env) != "":
			s.value, s.err = fromEnv[T](os.Getenv(s.Env))
		case !s.running:
			// Without Run nobody would stop the server.
			s.err = errors.New("call Run(m) from TestMain, so the server is stopped when the tests end" + s.orEnv(""))
		default:
			s.value, s.stop, s.err = s.Start()
			if s.err != nil {
				s.err = fmt.Errorf("cannot start it%s: %w", s.orEnv(" to use a running server"), s.err)
			}
		}
	}
	if s.err != nil {
		t.Fatalf("%s: %v", s.Name, s.err)
	}
	return s.value
}

// orEnv is " (set Env…)" for the messages, or "" without Env.
func (s *Shared[T]) orEnv(what string) string {
	if s.Env == "" {
		return ""
	}
	return " (set " + s.Env + what + ")"
}

// fromEnv is the server named by an environment variable: the string
// itself, for T string.
func fromEnv[T any](v string) (T, error) {
	var server T
	p, ok := any(&server).(*string)
	if !ok {
		return server, fmt.Errorf("servertest: Env is only for a string server, not %T", server)
	}
	*p = v
	return server, nil
}

// WatchEnv names the environment variable of hack/lib/server.sh with the PID
// of the process whose end stops the server (its watchdog).
const WatchEnv = "HANDOFF_WATCH_PID"

// StartScript runs hack/<script> start DIR PORT, in a new temporary
// directory on a free port, with WatchEnv set to this process's PID (the
// script's watchdog stops the server once the process is gone), bounded by
// timeout (the script may install the server), and returns what the script
// printed on stdout (the server's address or URL) and the func that runs
// hack/<script> stop DIR and removes the directory (kept, with its log, if
// the stop fails). Another process may take the free port first: it tries
// three times. For commands (benchmarks) as well as tests.
func StartScript(script string, timeout time.Duration) (out string, stop func(), err error) {
	path, err := Script(script)
	if err != nil {
		return "", nil, err
	}
	for attempt := 1; ; attempt++ {
		// Not t.TempDir: its parent is private to root, and a server may
		// run as another user (PostgreSQL as postgres, the script chowns
		// the directory). A new directory per attempt, so a retry never
		// starts from what a failed one left half made.
		dir, err := os.MkdirTemp("", "handoff-"+strings.TrimSuffix(script, ".sh")+"-")
		if err != nil {
			return "", nil, err
		}
		stop := func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if out, err := exec.CommandContext(ctx, "bash", path, "stop", dir).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "%s stop %s: %v\n%s", path, dir, err, out)
				return // keep the directory and its log
			}
			_ = os.RemoveAll(dir)
		}
		port, err := FreePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return "", nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		cmd := exec.CommandContext(ctx, "bash", path, "start", dir, strconv.Itoa(port))
		cmd.Env = append(os.Environ(), WatchEnv+"="+strconv.Itoa(os.Getpid()))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.Output()
		cancel()
		if err == nil {
			return strings.TrimSpace(string(stdout)), stop, nil
		}
		stop()
		if attempt == 3 {
			return "", nil, fmt.Errorf("%s start %s %d: %w\n%s", path, dir, port, err, stderr.Bytes())
		}
	}
}

// Script returns the path of hack/<name>, found by walking up from the
// working directory to the module root.
func Script(name string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "hack", name), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory, so no hack/" + name)
		}
		dir = parent
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
