package connlimit_test

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/internal/connlimit"
)

// server accepts from l until it is closed, sending each connection on the
// channel it returns.
func server(t *testing.T, l net.Listener) <-chan net.Conn {
	t.Helper()
	accepted := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		for c := range accepted {
			_ = c.Close()
		}
	})
	return accepted
}

func listen(t *testing.T, lim connlimit.Limits) (*connlimit.Listener, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.Listen(ln, lim)
	return l, server(t, l)
}

// dial connects from the loopback address from ("" for a Unix socket).
func dial(t *testing.T, from string, addr net.Addr) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: soon}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c, err := d.Dial(addr.Network(), addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The test's own bound on a wait that the listener should end at once.
const soon = 5 * time.Second

func accepted(t *testing.T, got <-chan net.Conn, what string) net.Conn {
	t.Helper()
	select {
	case c := <-got:
		return c
	case <-time.After(soon):
		t.Fatalf("%s: not accepted within %s", what, soon)
		return nil
	}
}

func notAccepted(t *testing.T, got <-chan net.Conn, what string) {
	t.Helper()
	select {
	case c := <-got:
		t.Fatalf("%s: accepted (from %s); want it held back", what, c.RemoteAddr())
	case <-time.After(200 * time.Millisecond):
	}
}

// refused dials addr from the loopback address from and fails unless the
// server resets the connection at once: the reset may come before the dial
// returns, or on the first read.
func refused(t *testing.T, from string, addr net.Addr, what string) {
	t.Helper()
	d := net.Dialer{Timeout: soon, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial(addr.Network(), addr.String())
	if err == nil {
		defer func() { _ = c.Close() }()
		_ = c.SetReadDeadline(time.Now().Add(soon))
		_, err = c.Read(make([]byte, 1))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("%s: %v; want the connection reset by the server at once", what, err)
	}
}

// One address gets PerAddr connections; the next from it is reset at
// once, while another address is still accepted; a closed connection gives
// its address's slot back.
func TestPerAddressCap(t *testing.T) {
	l, got := listen(t, connlimit.Limits{Total: 10, PerAddr: 2})
	var held []net.Conn
	for range 2 {
		dial(t, "127.0.0.2", l.Addr())
		held = append(held, accepted(t, got, "one of the first 2 from 127.0.0.2"))
	}
	refused(t, "127.0.0.2", l.Addr(), "the 3rd from 127.0.0.2")
	if n := l.Refused(); n != 1 {
		t.Errorf("Refused() = %d, want 1", n)
	}
	dial(t, "127.0.0.1", l.Addr())
	accepted(t, got, "the first from 127.0.0.1")

	_ = held[0].Close()
	_ = held[0].Close() // a second Close gives nothing back twice
	dial(t, "127.0.0.2", l.Addr())
	accepted(t, got, "127.0.0.2 after one of its connections closed")
	refused(t, "127.0.0.2", l.Addr(), "127.0.0.2 at its cap again")
}

// Past Total, Accept waits: the connection waits in the kernel's queue and
// is accepted once one closes.
func TestTotalCapWaits(t *testing.T) {
	l, got := listen(t, connlimit.Limits{Total: 2, PerAddr: 2})
	first := func() net.Conn { dial(t, "127.0.0.2", l.Addr()); return accepted(t, got, "127.0.0.2") }()
	dial(t, "127.0.0.3", l.Addr())
	accepted(t, got, "127.0.0.3")
	waiting := dial(t, "127.0.0.4", l.Addr())
	notAccepted(t, got, "a 3rd connection with 2 open")
	_ = first.Close()
	c := accepted(t, got, "the 3rd, once one closed")
	if _, err := io.WriteString(c, "x"); err != nil {
		t.Fatal(err)
	}
	_ = waiting.SetReadDeadline(time.Now().Add(soon))
	if _, err := waiting.Read(make([]byte, 1)); err != nil {
		t.Errorf("the connection that waited: %v; want it served", err)
	}
	if n := l.Refused(); n != 0 {
		t.Errorf("Refused() = %d, want 0: waiting is not refusing", n)
	}
}

// Unix socket connections have no address: the total alone bounds them.
func TestUnixSocketsCountAgainstTheTotalOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.Listen(ln, connlimit.Limits{Total: 3, PerAddr: 1})
	got := server(t, l)
	for range 3 {
		dial(t, "", l.Addr())
		accepted(t, got, "a Unix socket connection within the total")
	}
	dial(t, "", l.Addr())
	notAccepted(t, got, "a 4th Unix socket connection with 3 open")
}

func TestLimitsBelowOnePanic(t *testing.T) {
	for _, lim := range []connlimit.Limits{{Total: 0, PerAddr: 1}, {Total: 1, PerAddr: 0}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Listen with %+v did not panic", lim)
				}
			}()
			connlimit.Listen(nil, lim)
		}()
	}
}
