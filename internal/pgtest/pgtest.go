// Package pgtest gives tests a fresh database on a real PostgreSQL.
//
// One server serves a whole test binary: the first Database (or Get) runs
// hack/postgres.sh in a temporary directory, and Run stops it when the
// tests are over. With HANDOFF_TEST_DATABASE_URL set, that server is used
// instead and nothing is started or stopped. Each Database is a database of
// its own, so tests may run in parallel. Under go test -short the tests
// that need the server are skipped (make unit).
//
//	func TestMain(m *testing.M) { pgtest.Run(m) }
//
//	func TestX(t *testing.T) {
//		url := pgtest.Database(t)
//		...
//	}
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/handoff-dev/handoff/internal/servertest"
)

// EnvDatabaseURL names the environment variable with the URL of an existing
// server to use, like postgres://postgres@127.0.0.1:5432/postgres. Its user
// must be allowed to create databases.
const EnvDatabaseURL = "HANDOFF_TEST_DATABASE_URL"

// startTimeout bounds hack/postgres.sh start; it may install PostgreSQL.
const startTimeout = 10 * time.Minute

// server is the one server of this test binary.
var server = &servertest.Shared[string]{Name: "PostgreSQL", Env: EnvDatabaseURL, Start: StartServer}

var seq atomic.Int64

// Run runs the tests of m and then stops the server Get started, if any.
// Call it from TestMain.
func Run(m *testing.M) { server.Run(m) }

// Setup is Run for a TestMain that runs the tests another way, like
// kubetest.Run: it lets Get start a server, and returns the func that stops
// it, to run once the tests are over.
//
//	func TestMain(m *testing.M) {
//		defer pgtest.Setup()()
//		kubetest.Run(m)
//	}
func Setup() (stop func()) { return server.Setup() }

// Get returns the URL of the server's "postgres" database (its user may
// create databases), starting the server on first use. Under go test -short
// it skips t. If no server can be had it fails t (it does not skip): a test
// that needs PostgreSQL must not pass silently without it.
func Get(t testing.TB) string {
	t.Helper()
	return server.Get(t)
}

// Database returns the URL of a new, empty database on the server (Get),
// dropped when t ends.
func Database(t testing.TB) string {
	t.Helper()
	admin := Get(t)

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

// StartServer runs hack/postgres.sh start in a new temporary directory on a
// free port and returns the URL of the server's "postgres" database and the
// func that stops the server and removes the directory. The script's
// watchdog stops the server should this process die first. For commands
// as well as tests.
func StartServer() (url string, stop func(), err error) {
	return servertest.StartScript("postgres.sh", startTimeout)
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
