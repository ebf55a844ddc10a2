// Package redistest gives tests a client of a real Redis server.
//
// One server serves a whole test binary: the first Client runs
// hack/redis.sh in a temporary directory, and Run stops it when the tests
// are over. With HANDOFF_TEST_REDIS_ADDR set, that server is used instead
// and nothing is started or stopped. Tests share the server's database 0:
// give each its own keys (Key), and they may run in parallel.
//
//	func TestMain(m *testing.M) { redistest.Run(m) }
//
//	func TestX(t *testing.T) {
//		rdb := redistest.Client(t)
//		stream := redistest.Key(t)
//		...
//	}
package redistest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
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

	"github.com/redis/go-redis/v9"
)

// EnvAddr names the environment variable with the host:port of an existing
// Redis server (6.2 or newer) to use, like 127.0.0.1:6379.
const EnvAddr = "HANDOFF_TEST_REDIS_ADDR"

// startTimeout bounds hack/redis.sh start; it may install Redis.
const startTimeout = 10 * time.Minute

// server is the one server of this test binary.
var server struct {
	mu      sync.Mutex
	running bool // Run is running the tests
	started bool // a start was attempted; addr and err hold its outcome
	addr    string
	err     error
	stop    func()
}

// Run runs the tests of m and then stops the server Client started, if
// any. Call it from TestMain.
func Run(m *testing.M) {
	server.mu.Lock()
	server.running = true
	server.mu.Unlock()
	defer func() {
		server.mu.Lock()
		defer server.mu.Unlock()
		server.running = false
		if server.stop != nil {
			server.stop()
			server.stop = nil
		}
	}()
	m.Run()
}

// Addr returns the host:port of the server, starting it on first use. If
// no server can be had it fails t (it does not skip): a test that needs
// Redis must not pass silently without it.
func Addr(t testing.TB) string {
	t.Helper()
	server.mu.Lock()
	defer server.mu.Unlock()
	if !server.started {
		server.started = true
		switch {
		case os.Getenv(EnvAddr) != "":
			server.addr = os.Getenv(EnvAddr)
		case !server.running:
			// Without Run nobody would stop the server.
			server.err = errors.New("call redistest.Run(m) from TestMain, so the Redis server is stopped when the tests end (or set " + EnvAddr + ")")
		default:
			server.addr, server.stop, server.err = StartServer()
			if server.err != nil {
				server.err = fmt.Errorf("cannot start Redis (set %s to use a running server): %w", EnvAddr, server.err)
			}
		}
	}
	if server.err != nil {
		t.Fatalf("redistest: %v", server.err)
	}
	return server.addr
}

// Client returns a client of the server (Addr), closed when t ends.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: Addr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Key returns a key no other test uses: a readable part from t's name and a
// random part, so test binaries sharing a server do not meet either. The
// keys are not deleted.
func Key(t testing.TB) string {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	return "test:" + strings.ReplaceAll(t.Name(), " ", "_") + ":" + hex.EncodeToString(rnd[:])
}

// StartServer runs hack/redis.sh start in a new temporary directory on a
// free port and returns the server's host:port and the func that stops it
// and removes the directory. The script's watchdog stops the server should
// this process die first. For commands (benchmarks) as well as tests.
func StartServer() (addr string, stop func(), err error) {
	script, err := script()
	if err != nil {
		return "", nil, err
	}
	// Another process may take the free port first; try a few times.
	for attempt := 1; ; attempt++ {
		dir, err := os.MkdirTemp("", "handoff-redistest-")
		if err != nil {
			return "", nil, err
		}
		stop := func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if out, err := exec.CommandContext(ctx, "bash", script, "stop", dir).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "redistest: stop Redis in %s: %v\n%s", dir, err, out)
				return // keep the directory and its log
			}
			_ = os.RemoveAll(dir)
		}
		port, err := freePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return "", nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		cmd := exec.CommandContext(ctx, "bash", script, "start", dir, strconv.Itoa(port))
		cmd.Env = append(os.Environ(), "HANDOFF_REDIS_WATCH_PID="+strconv.Itoa(os.Getpid()))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		cancel()
		if err == nil {
			return strings.TrimSpace(string(out)), stop, nil
		}
		stop()
		if attempt == 3 {
			return "", nil, fmt.Errorf("%s start %s %d: %w\n%s", script, dir, port, err, stderr.Bytes())
		}
	}
}

// script returns the path of hack/redis.sh, found by walking up from the
// working directory to the module root.
func script() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "hack", "redis.sh"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory, so no hack/redis.sh")
		}
		dir = parent
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
