// Package redistest gives tests a client of a real Redis server.
//
// One server serves a whole test binary: the first Get (or Client) runs
// hack/redis.sh in a temporary directory, and Run stops it when the tests
// are over. With HANDOFF_TEST_REDIS_ADDR set, that server is used instead
// and nothing is started or stopped. Tests share the server's database 0:
// give each its own keys (Key), and they may run in parallel. Under go test
// -short the tests that need the server are skipped (make unit).
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
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoff-dev/handoff/internal/servertest"
)

// EnvAddr names the environment variable with the host:port of an existing
// Redis server (6.2 or newer) to use, like 127.0.0.1:6379.
const EnvAddr = "HANDOFF_TEST_REDIS_ADDR"

// startTimeout bounds hack/redis.sh start; it may install Redis.
const startTimeout = 10 * time.Minute

// server is the one server of this test binary.
var server = &servertest.Shared[string]{Name: "Redis", Env: EnvAddr, Start: StartServer}

// Run runs the tests of m and then stops the server Get started, if
// any. Call it from TestMain.
func Run(m *testing.M) { server.Run(m) }

// Setup is Run for a TestMain that runs the tests another way: it lets Get
// start a server, and returns the func that stops it, to run once the tests
// are over.
func Setup() (stop func()) { return server.Setup() }

// Get returns the host:port of the server, starting it on first use. Under
// go test -short it skips t. If no server can be had it fails t (it does not
// skip): a test that needs Redis must not pass silently without it.
func Get(t testing.TB) string {
	t.Helper()
	return server.Get(t)
}

// Client returns a client of the server (Get), closed when t ends.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: Get(t)})
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
	return servertest.StartScript("redis.sh", startTimeout)
}
