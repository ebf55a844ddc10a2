// Package pgtest gives tests a fresh database on a real PostgreSQL.
//
// One server serves a whole test binary: the first Start runs
// hack/postgres.sh in a temporary directory, and Run stops it when the tests
// are over. With HANDOFF_TEST_DATABASE_URL set, that server is used instead
// and nothing is started or stopped. Each Start creates its own database, so
// tests may run in parallel.
//
//	func TestMain(m *testing.M) { pgtest.Run(m) }
//
//	func TestX(t *testing.T) {
//		url := pgtest.Start(t)
//		...
//	}
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDatabaseURL names the environment variable with the URL of an existing
// server to use, like postgres://postgres@127.0.0.1:5432/postgres. Its user
// must be allowed to create databases.
const EnvDatabaseURL = "HANDOFF_TEST_DATABASE_URL"

// startTimeout bounds hack/postgres.sh start; it may install PostgreSQL.
const startTimeout = 10 * time.Minute

// server is the one server of this test binary.
var server struct {
	mu      sync.Mutex
	running bool   // Run is running the tests
	started bool   // a start was attempted; url and err hold its outcome
	url     string // admin URL, to the "postgres" database
	err     error
	dir     string // set when this package started the server
}

var seq atomic.Int64

// Run runs the tests of m and then stops the server Start started, if any.
// Call it from TestMain; when TestMain returns, the test binary exits with
// the code of m.Run.
func Run(m *testing.M) {
	server.mu.Lock()
	server.running = true
	server.mu.Unlock()
	defer stop()
	m.Run()
}

// Setup is Run for a test binary whose TestMain runs the tests another way,
// like kubetest.MainWith: it lets Start start a server, and returns the
// func that stops it, to run once the tests are over.
//
//	func TestMain(m *testing.M) {
//		kubetest.MainWith(m, func(*kubetest.Env) (func(), error) { return pgtest.Setup(), nil })
//	}
func Setup() func() {
	server.mu.Lock()
	server.running = true
	server.mu.Unlock()
	return stop
}

// Start returns the URL of a new, empty database, dropped when t ends. The
// first call starts the server unless HANDOFF_TEST_DATABASE_URL is set. If
// no server can be had, Start fails t (it does not skip): a test that
// needs PostgreSQL must not pass silently without it.
func Start(t testing.TB) string {
	t.Helper()
	admin, err := adminURL()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}

	name := dbName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := exec1(ctx, admin, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// FORCE ends connections the test left open.
		if err := exec1(ctx, admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})

	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("pgtest: database URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// adminURL returns the URL of the server's "postgres" database, starting
// the server on first use. A failed start is not retried.
func adminURL() (string, error) {
	server.mu.Lock()
	defer server.mu.Unlock()
	if server.started {
		return server.url, server.err
	}
	if u := os.Getenv(EnvDatabaseURL); u != "" {
		server.started, server.url = true, u
		return u, nil
	}
	if !server.running {
		// Without Run nobody would stop the server.
		return "", errors.New("call pgtest.Run(m) from TestMain, so the PostgreSQL server is stopped when the tests end (or set " + EnvDatabaseURL + ")")
	}
	server.started = true
	server.url, server.dir, server.err = startServer()
	if server.err != nil {
		server.err = fmt.Errorf("cannot start PostgreSQL (set %s to use a running server): %w", EnvDatabaseURL, server.err)
	}
	return server.url, server.err
}

// startServer runs hack/postgres.sh start in a new temporary directory on a
// free port, and returns the URL it prints and the directory.
func startServer() (string, string, error) {
	script, err := script()
	if err != nil {
		return "", "", err
	}
	// Another test binary may take the free port first; try a few times,
	// each in a new directory, so a retry never starts from what a failed
	// attempt left half made.
	for attempt := 1; ; attempt++ {
		// Not t.TempDir: its parent is private to root, and the server may
		// run as the postgres user. MkdirTemp's directory is chowned by the
		// script.
		dir, err := os.MkdirTemp("", "handoff-pgtest-")
		if err != nil {
			return "", "", err
		}
		port, err := freePort()
		if err != nil {
			return "", dir, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		cmd := exec.CommandContext(ctx, "bash", script, "start", dir, strconv.Itoa(port))
		// The script's watchdog stops the server should this process die
		// without running Run's cleanup (a test timeout, ^C).
		cmd.Env = append(os.Environ(), "HANDOFF_PG_WATCH_PID="+strconv.Itoa(os.Getpid()))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		cancel()
		if err == nil {
			return strings.TrimSpace(string(out)), dir, nil
		}
		if attempt == 3 {
			return "", dir, fmt.Errorf("%s start %s %d: %w\n%s", script, dir, port, err, stderr.Bytes())
		}
		ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
		_ = exec.CommandContext(ctx, "bash", script, "stop", dir).Run()
		cancel()
		_ = os.RemoveAll(dir)
	}
}

// stop stops the server Start started, if any, and removes its directory.
func stop() {
	server.mu.Lock()
	defer server.mu.Unlock()
	server.running = false
	if server.dir == "" {
		return
	}
	if script, err := script(); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", script, "stop", server.dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: stop PostgreSQL in %s: %v\n%s", server.dir, err, out)
			return // keep the directory and its log
		}
	}
	_ = os.RemoveAll(server.dir)
	server.dir = ""
}

// script returns the path of hack/postgres.sh, found by walking up from the
// working directory (the package under test) to the module root.
func script() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "hack", "postgres.sh"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory, so no hack/postgres.sh")
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

// dbName returns a new database name: a readable part from the test name,
// and a unique part that also holds between test binaries sharing a server.
// The result is at most 63 bytes, PostgreSQL's limit.
func dbName(test string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(test) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		if b.Len() == 32 {
			break
		}
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return fmt.Sprintf("pgtest_%s_%d_%s", b.String(), seq.Add(1), hex.EncodeToString(rnd[:]))
}

// exec1 runs one statement on its own connection to url.
func exec1(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(ctx, sql)
	return err
}
