package protocol_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/handoff-dev/handoff/protocol"
)

func TestParseEndpoint(t *testing.T) {
	long := "unix:///" + strings.Repeat("a", 107)
	for _, tc := range []struct {
		in, network, address, err string
	}{
		{in: "unix:///handoff-run/app.sock", network: "unix", address: "/handoff-run/app.sock"},
		{in: "http://127.0.0.1:7452", network: "tcp", address: "127.0.0.1:7452"},
		{in: "http://127.0.0.1:7452/", network: "tcp", address: "127.0.0.1:7452"},
		{in: "127.0.0.1:7450", network: "tcp", address: "127.0.0.1:7450"},
		{in: "[::1]:0", network: "tcp", address: "[::1]:0"},
		{in: "localhost:7450", err: "localhost names both 127.0.0.1 and ::1"},
		{in: "http://localhost:7452", err: "localhost names both 127.0.0.1 and ::1"},
		{in: "unix://run/app.sock", err: "not absolute"},
		{in: "unix:///run/../app.sock", err: "not clean"},
		{in: long, err: "more than the 107"},
		{in: "http://10.0.0.1:7452", err: "not a loopback address"},
		{in: ":7450", err: "not a loopback address"},
		{in: "http://127.0.0.1:7452/app", err: "no user, path, query or fragment"},
		{in: "http://127.0.0.1:7452?x=1", err: "no user, path, query or fragment"},
		{in: "http://u@127.0.0.1:7452", err: "no user, path, query or fragment"},
		{in: "127.0.0.1:99999", err: "not a number from 0 to 65535"},
		{in: "https://127.0.0.1:7452", err: "not a host:port"},
		{in: "", err: "not a host:port"},
	} {
		e, err := protocol.ParseEndpoint(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "want unix://") {
				t.Errorf("ParseEndpoint(%q) = %v, %v; want an error saying %q and the accepted forms", tc.in, e, err, tc.err)
			}
			continue
		}
		if err != nil || e.Network != tc.network || e.Address != tc.address {
			t.Errorf("ParseEndpoint(%q) = %+v, %v; want %s %s", tc.in, e, err, tc.network, tc.address)
		}
		if again, err := protocol.ParseEndpoint(e.String()); err != nil || again != e {
			t.Errorf("ParseEndpoint(%q.String() = %q) = %+v, %v; want the same endpoint", tc.in, e.String(), again, err)
		}
	}
}

func socketIn(t *testing.T) protocol.Endpoint {
	t.Helper()
	// A short directory: t.TempDir's paths can pass the 107 bytes.
	dir, err := os.MkdirTemp("", "hs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return protocol.Endpoint{Network: "unix", Address: filepath.Join(dir, "s.sock")}
}

// A socket is made with SocketMode; closing its listener removes it; a
// stale one (its server gone) is replaced, one still served is not, and a
// path that is not a socket is never replaced.
func TestListenOnASocket(t *testing.T) {
	ctx := context.Background()
	e := socketIn(t)
	ln, err := e.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(e.Address)
	if err != nil || fi.Mode().Perm() != protocol.SocketMode || fi.Mode().Type() != fs.ModeSocket {
		t.Fatalf("the socket: %v, %v; want a socket of mode %o", fi.Mode(), err, protocol.SocketMode)
	}
	if _, err := e.Listen(ctx); err == nil || !strings.Contains(err.Error(), "another process serves it") {
		t.Errorf("a second Listen while served: %v; want refused", err)
	}
	_ = ln.Close()
	if _, err := os.Lstat(e.Address); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Close: %v; want the socket removed", err)
	}

	// A stale socket: bound by a listener that does not remove it.
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: e.Address, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	_ = l.Close()
	ln, err = e.Listen(ctx)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	_ = ln.Close()

	// A file, a link to a socket: refused, and left alone.
	if err := os.WriteFile(e.Address, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Listen(ctx); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen over a file: %v; want refused", err)
	}
	if b, _ := os.ReadFile(e.Address); string(b) != "x" {
		t.Errorf("the file was changed")
	}
}

// A dial follows no link and connects to no file; a missing socket is a
// refused connection.
func TestDialASocket(t *testing.T) {
	ctx := context.Background()
	e := socketIn(t)
	if _, err := e.Dial(ctx, "", ""); !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Dial of no socket: %v; want a refused connection", err)
	}
	ln, err := e.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	c, err := e.Dial(ctx, "tcp", "ignored:80")
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	_ = c.Close()
	link := protocol.Endpoint{Network: "unix", Address: filepath.Join(filepath.Dir(e.Address), "link.sock")}
	if err := os.Symlink(e.Address, link.Address); err != nil {
		t.Fatal(err)
	}
	if _, err := link.Dial(ctx, "", ""); !errors.Is(err, protocol.ErrNotASocket) {
		t.Errorf("Dial of a link to the socket: %v; want ErrNotASocket", err)
	}
	file := protocol.Endpoint{Network: "unix", Address: filepath.Join(filepath.Dir(e.Address), "file")}
	if err := os.WriteFile(file.Address, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := file.Dial(ctx, "", ""); !errors.Is(err, protocol.ErrNotASocket) {
		t.Errorf("Dial of a file: %v; want ErrNotASocket", err)
	}
}
