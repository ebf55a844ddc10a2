// Package rabbittest gives tests a connection to a real RabbitMQ node.
//
// One node serves a whole test binary: the first Get (or Conn) runs
// hack/rabbitmq.sh in a temporary directory, and Run stops it when the tests
// are over. With HANDOFF_TEST_RABBITMQ_URL set, that node is used instead
// and nothing is started or stopped. Tests share the node's default virtual host: give
// each its own queues (Queue), and they may run in parallel. Under go test
// -short the tests that need the node are skipped (make unit).
//
//	func TestMain(m *testing.M) { rabbittest.Run(m) }
//
//	func TestX(t *testing.T) {
//		conn := rabbittest.Conn(t)
//		queue := rabbittest.Queue(t, conn)
//		...
//	}
package rabbittest

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/handoff-dev/handoff/internal/servertest"
)

// EnvURL names the environment variable with the URL of an existing
// RabbitMQ node to use, like amqp://guest:guest@127.0.0.1:5672/.
const EnvURL = "HANDOFF_TEST_RABBITMQ_URL"

// startTimeout bounds hack/rabbitmq.sh start; it may install RabbitMQ.
const startTimeout = 10 * time.Minute

// server is the one server of this test binary.
var server = &servertest.Shared[string]{Name: "RabbitMQ", Env: EnvURL, Start: StartServer}

// Run runs the tests of m and then stops the node Get started, if any.
// Call it from TestMain.
func Run(m *testing.M) { server.Run(m) }

// Setup is Run for a TestMain that runs the tests another way: it lets Get
// start a server, and returns the func that stops it, to run once the tests
// are over.
func Setup() (stop func()) { return server.Setup() }

// Get returns the AMQP URL of the node, starting it on first use. Under go
// test -short it skips t. If no node can be had it fails t (it does not
// skip): a test that needs RabbitMQ must not pass silently without it.
func Get(t testing.TB) string {
	t.Helper()
	return server.Get(t)
}

// Conn returns a new connection to the node (Get), closed when t ends.
func Conn(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(Get(t))
	if err != nil {
		t.Fatalf("rabbittest: dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Queue declares a durable classic queue no other test uses (a readable
// part from t's name and a random part), deleted when t ends, and returns
// its name.
func Queue(t testing.TB, conn *amqp.Connection) string {
	t.Helper()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "test." + strings.ReplaceAll(t.Name(), " ", "_") + "." + hex.EncodeToString(rnd[:])
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("rabbittest: channel: %v", err)
	}
	defer func() { _ = ch.Close() }()
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatalf("rabbittest: declare queue %s: %v", name, err)
	}
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err != nil {
			return // the test closed the connection: the node goes with the binary
		}
		defer func() { _ = ch.Close() }()
		_, _ = ch.QueueDelete(name, false, false, false)
	})
	return name
}

// StartServer runs hack/rabbitmq.sh start in a new temporary directory on a
// free port and returns the node's AMQP URL and the func that stops it and
// removes the directory. The script's watchdog stops the node should this
// process die first. For commands (benchmarks) as well as tests.
func StartServer() (url string, stop func(), err error) {
	return servertest.StartScript("rabbitmq.sh", startTimeout)
}
