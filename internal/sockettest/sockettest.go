// Package sockettest gives tests Unix sockets as an injected pod has them:
// made by protocol.Endpoint.Listen, in a directory of their own.
package sockettest

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// Dir is a new directory for sockets, removed when the test ends. It is
// under os.TempDir with a short name: a socket path has at most 107 bytes,
// which t.TempDir's long paths can pass.
func Dir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Serve serves h on a socket named name in a new Dir until the test ends,
// and returns the socket's endpoint and listener.
func Serve(t testing.TB, name string, h http.Handler) (protocol.Endpoint, net.Listener) {
	t.Helper()
	e := protocol.Endpoint{Network: "unix", Address: filepath.Join(Dir(t), name)}
	ln, err := e.Listen(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return e, ln
}
