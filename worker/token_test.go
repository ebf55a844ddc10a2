package worker_test

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// testToken is the pod's token in these tests.
const testToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// newAgent is worker.New with the test token.
func newAgent(t testing.TB, o worker.Options) *worker.Agent {
	t.Helper()
	o.Token = testToken
	a, err := worker.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sign signs req, whose body is body, as the sidecar signs its calls.
func sign(req *http.Request, body string) *http.Request {
	protocol.Sign(req, testToken, []byte(body), time.Now())
	return req
}

// socket is a Unix socket path for one test, short enough to bind.
func socket(t *testing.T) protocol.Endpoint {
	t.Helper()
	// Under os.TempDir with a short name: a socket path has at most 107
	// bytes, which t.TempDir's long paths can pass.
	dir, err := os.MkdirTemp("", "hw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return protocol.Endpoint{Network: "unix", Address: filepath.Join(dir, "app.sock")}
}

// serve runs a.ListenAndServe on a Unix socket, as an injected worker
// serves (protocol.AppSocket), until the test ends, and returns a client
// that calls it as the sidecar does: signed, on the socket.
func serve(t *testing.T, a *worker.Agent) *protocol.AppClient {
	t.Helper()
	e := socket(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.ListenAndServe(ctx, e.String()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ListenAndServe: %v", err)
		}
	})
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := os.Lstat(e.Address); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) || time.Now().After(deadline) {
			t.Fatalf("the app socket %s: %v", e.Address, err)
		}
		select {
		case err := <-served:
			t.Fatalf("ListenAndServe: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return protocol.NewAppClient(e, testToken)
}
