// Package rabbittest gives tests a connection to a real RabbitMQ node.
//
// One node serves a whole test binary: the first URL runs hack/rabbitmq.sh
// in a temporary directory, and Run stops it when the tests are over. With
// HANDOFF_TEST_RABBITMQ_URL set, that node is used instead and nothing is
// started or stopped. Tests share the node's default virtual host: give
// each its own queues (Queue), and they may run in parallel.
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

	amqp "github.com/rabbitmq/amqp091-go"
)

// EnvURL names the environment variable with the URL of an existing
// RabbitMQ node to use, like amqp://guest:guest@127.0.0.1:5672/.
const EnvURL = "HANDOFF_TEST_RABBITMQ_URL"

// startTimeout bounds hack/rabbitmq.sh start; it may install RabbitMQ.
const startTimeout = 10 * time.Minute

// server is the one server of this test binary.
var server struct {
	mu      sync.Mutex
	running bool // Run is running the tests
	started bool // a start was attempted; addr and err hold its outcome
	url     string
	err     error
	stop    func()
}

// Run runs the tests of m and then stops the node URL started, if any.
// Call it from TestMain.
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

// URL returns the AMQP URL of the node, starting it on first use. If no
// node can be had it fails t (it does not skip): a test that needs
// RabbitMQ must not pass silently without it.
func URL(t testing.TB) string {
	t.Helper()
	server.mu.Lock()
	defer server.mu.Unlock()
	if !server.started {
		server.started = true
		switch {
		case os.Getenv(EnvURL) != "":
			server.url = os.Getenv(EnvURL)
		case !server.running:
			// Without Run nobody would stop the server.
			server.err = errors.New("call rabbittest.Run(m) from TestMain, so the RabbitMQ node is stopped when the tests end (or set " + EnvURL + ")")
		default:
			server.url, server.stop, server.err = StartServer()
			if server.err != nil {
				server.err = fmt.Errorf("cannot start RabbitMQ (set %s to use a running server): %w", EnvURL, server.err)
			}
		}
	}
	if server.err != nil {
		t.Fatalf("rabbittest: %v", server.err)
	}
	return server.url
}

// Conn returns a new connection to the node (URL), closed when t ends.
func Conn(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(URL(t))
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
	script, err := script()
	if err != nil {
		return "", nil, err
	}
	// Another process may take the free port first; try a few times.
	for attempt := 1; ; attempt++ {
		dir, err := os.MkdirTemp("", "handoff-rabbittest-")
		if err != nil {
			return "", nil, err
		}
		stop := func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if out, err := exec.CommandContext(ctx, "bash", script, "stop", dir).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "rabbittest: stop RabbitMQ in %s: %v\n%s", dir, err, out)
				return // keep the directory and its log
			}
			_ = os.RemoveAll(dir)
		}
		// The node listens on port and port+1 (Erlang distribution).
		port, err := freePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return "", nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		cmd := exec.CommandContext(ctx, "bash", script, "start", dir, strconv.Itoa(port))
		cmd.Env = append(os.Environ(), "HANDOFF_RABBITMQ_WATCH_PID="+strconv.Itoa(os.Getpid()))
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

// script returns the path of hack/rabbitmq.sh, found by walking up from the
// working directory to the module root.
func script() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "hack", "rabbitmq.sh"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory, so no hack/rabbitmq.sh")
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
