// Package natstest gives tests a real nats-server with JetStream.
//
// One server serves a whole test binary: the first Get starts
// nats-server (installed by hack/nats-server.sh, from the Go module proxy,
// if missing) with JetStream on a free port of 127.0.0.1, its store in a
// temporary directory, and Run stops it when the tests are over. With
// HANDOFF_TEST_NATS_URL set, that server is used instead and nothing is
// started or stopped. Tests share the server: each names its own streams
// (StreamName gives a unique one), so they may run in parallel. Under go
// test -short the tests that need the server are skipped (make unit).
//
//	func TestMain(m *testing.M) { natstest.Run(m) }
//
//	func TestX(t *testing.T) {
//		url := natstest.Get(t) // nats://127.0.0.1:PORT
//		...
//	}
package natstest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/handoff-dev/handoff/internal/servertest"
)

// EnvURL names the environment variable with the URL of a running
// nats-server with JetStream to use, like nats://127.0.0.1:4222.
const EnvURL = "HANDOFF_TEST_NATS_URL"

// EnvServer names the environment variable with the path of a nats-server
// binary to run; empty: the one hack/nats-server.sh installs.
const EnvServer = "HANDOFF_NATS_SERVER"

const (
	// installTimeout bounds hack/nats-server.sh; a cold build takes 1-3
	// minutes on 2 cores.
	installTimeout = 10 * time.Minute
	// readyTimeout bounds the wait for a started server to accept a
	// JetStream request.
	readyTimeout = 30 * time.Second
	// stopTimeout bounds the wait for the server to exit after SIGTERM;
	// then it is killed.
	stopTimeout = 10 * time.Second
)

// server is the one server of this test binary.
var server = &servertest.Shared[string]{Name: "nats-server", Env: EnvURL, Start: StartServer}

var seq atomic.Int64

// Run runs the tests of m and then stops the server Get started, if any.
// Call it from TestMain.
func Run(m *testing.M) { server.Run(m) }

// Setup is Run for a TestMain that runs the tests another way: it lets Get
// start a server, and returns the func that stops it, to run once the tests
// are over.
func Setup() (stop func()) { return server.Setup() }

// Get returns the URL of the server, nats://127.0.0.1:PORT, starting it on
// first use unless HANDOFF_TEST_NATS_URL is set. Under go test -short it
// skips t. If no server can be had it fails t (it does not skip): a test
// that needs NATS must not pass silently without it.
func Get(t testing.TB) string {
	t.Helper()
	return server.Get(t)
}

// Connect returns a connection to the server (Get), closed when t ends.
func Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(Get(t), opts...)
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// StreamName returns a stream name unique to this test binary's server,
// with a readable part from the test's name: letters and digits only, as
// JetStream names allow.
func StreamName(t testing.TB) string {
	var b strings.Builder
	for _, r := range t.Name() {
		if (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		}
		if b.Len() == 32 {
			break
		}
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return fmt.Sprintf("%s_%d_%s", b.String(), seq.Add(1), hex.EncodeToString(rnd[:]))
}

// StartServer starts nats-server with JetStream (the binary
// $HANDOFF_NATS_SERVER, else the one hack/nats-server.sh installs, which
// it builds if missing: up to 10 minutes) on a free port of 127.0.0.1, its
// store in a new temporary directory, and waits until it answers a
// JetStream request (at most 30 s), and returns its URL,
// nats://127.0.0.1:PORT, and the func that stops it (SIGTERM, then SIGKILL
// after 10 s) and removes the directory. The server dies with this process
// (Pdeathsig); stop stops it sooner. For commands (benchmarks) as well as
// tests.
func StartServer() (url string, stop func(), err error) {
	bin, err := binary()
	if err != nil {
		return "", nil, err
	}
	// Another process may take the free port first; try a few times, each
	// in a new directory.
	for attempt := 1; ; attempt++ {
		s, err := startOnce(bin)
		if err == nil {
			return s.url, s.stop, nil
		}
		if attempt == 3 {
			return "", nil, err
		}
	}
}

// process is a nats-server StartServer started.
type process struct {
	url    string
	cmd    *exec.Cmd
	exited chan struct{}
	dir    string
}

// startOnce is one attempt of StartServer.
func startOnce(bin string) (*process, error) {
	dir, err := os.MkdirTemp("", "handoff-natstest-")
	if err != nil {
		return nil, err
	}
	port, err := servertest.FreePort()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	logFile := filepath.Join(dir, "nats-server.log")
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(dir, "store"), "-l", logFile)
	// The server dies with this test binary, also when it is killed without
	// running Run's cleanup (a test timeout, ^C).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	if err := waitReady(url, exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		log, _ := os.ReadFile(logFile)
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%s on port %d: %w\n%s", bin, port, err, log)
	}
	return &process{url: url, cmd: cmd, exited: exited, dir: dir}, nil
}

// waitReady waits until the server at url answers a JetStream account
// request, the server exits, or readyTimeout passes.
func waitReady(url string, exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("exited at start")
		default:
		}
		nc, err := nats.Connect(url, nats.Timeout(time.Second), nats.NoReconnect())
		if err == nil {
			// $JS.API.INFO answers once JetStream is enabled.
			_, err = nc.Request("$JS.API.INFO", nil, time.Second)
			nc.Close()
			if err == nil {
				return nil
			}
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready in %s: %w", readyTimeout, last)
}

// stop stops the server (SIGTERM, then SIGKILL after 10 s) and removes its
// directory. Calls after the first do nothing.
func (s *process) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		fmt.Fprintf(os.Stderr, "natstest: nats-server did not exit %s after SIGTERM; killed\n", stopTimeout)
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	_ = os.RemoveAll(s.dir)
	s.cmd = nil
}

// binary returns the nats-server to run: $HANDOFF_NATS_SERVER, else the
// one hack/nats-server.sh installs (and prints).
func binary() (string, error) {
	if b := os.Getenv(EnvServer); b != "" {
		return b, nil
	}
	script, err := servertest.Script("nats-server.sh")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w\n%s", script, err, stderr.Bytes())
	}
	return strings.TrimSpace(string(out)), nil
}
