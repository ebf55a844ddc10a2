// Package servertest is what the packages that give tests a real server
// (internal/redistest, internal/rabbittest, internal/natstest) share: one
// server per test binary, started on first use and stopped when the tests
// end (Shared), or an existing one named by an environment variable; a
// server started by its hack/ script in a temporary directory on a free
// port, with the script's watchdog stopping it should the process die
// (StartScript); the module's hack/ scripts (Script); a free port
// (FreePort).
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

// Shared is the one server of a test binary. Name it, set Env and Start,
// call Run from TestMain and Get from the tests.
type Shared struct {
	// Name is the server's name in errors, like "Redis".
	Name string
	// Env names the environment variable with the address of an existing
	// server to use instead; nothing is then started or stopped.
	Env string
	// Start starts a server and returns its address and the func that
	// stops it.
	Start func() (addr string, stop func(), err error)

	mu      sync.Mutex
	running bool // Run is running the tests
	started bool // a start was attempted; addr and err hold its outcome
	addr    string
	err     error
	stop    func()
}

// Run runs the tests of m and then stops the server Get started, if any.
func (s *Shared) Run(m *testing.M) {
	s.mu.Lock()
	s.running = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.running = false
		if s.stop != nil {
			s.stop()
			s.stop = nil
		}
	}()
	m.Run()
}

// Get returns the server's address, starting it on first use. If no server
// can be had it fails t (it does not skip): a test that needs the server
// must not pass silently without it.
func (s *Shared) Get(t testing.TB) string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		s.started = true
		switch {
		case os.Getenv(s.Env) != "":
			s.addr = os.Getenv(s.Env)
		case !s.running:
			// Without Run nobody would stop the server.
			s.err = fmt.Errorf("call Run(m) from TestMain, so the %s server is stopped when the tests end (or set %s)", s.Name, s.Env)
		default:
			s.addr, s.stop, s.err = s.Start()
			if s.err != nil {
				s.err = fmt.Errorf("cannot start %s (set %s to use a running server): %w", s.Name, s.Env, s.err)
			}
		}
	}
	if s.err != nil {
		t.Fatalf("%s: %v", s.Name, s.err)
	}
	return s.addr
}

// StartScript runs hack/<script> start DIR PORT, in a new temporary
// directory on a free port, with watchEnv set to this process's PID (the
// script's watchdog stops the server once the process is gone), bounded by
// timeout (the script may install the server), and returns what the script
// printed on stdout (the server's address or URL) and the func that runs
// hack/<script> stop DIR and removes the directory (kept, with its log, if
// the stop fails). Another process may take the free port first: it tries
// three times. For commands (benchmarks) as well as tests.
func StartScript(script, watchEnv string, timeout time.Duration) (out string, stop func(), err error) {
	path, err := Script(script)
	if err != nil {
		return "", nil, err
	}
	for attempt := 1; ; attempt++ {
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
		cmd.Env = append(os.Environ(), watchEnv+"="+strconv.Itoa(os.Getpid()))
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
