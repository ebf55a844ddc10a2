package connlimit_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
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
// once while none of its open ones may be closed (all young), while
// another address is still accepted; a closed connection gives its
// address's slot back.
func TestPerAddressCap(t *testing.T) {
	l, got := listen(t, connlimit.Limits{Total: 10, PerAddr: 2, Grace: time.Hour})
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

// Past Total, with every open connection young, a new one is reset at once.
func TestTotalCapResetsWhenNothingCanBeClosed(t *testing.T) {
	l, got := listen(t, connlimit.Limits{Total: 2, PerAddr: 2, Grace: time.Hour})
	dial(t, "127.0.0.2", l.Addr())
	accepted(t, got, "127.0.0.2")
	dial(t, "127.0.0.3", l.Addr())
	accepted(t, got, "127.0.0.3")
	refused(t, "127.0.0.4", l.Addr(), "a 3rd connection with 2 open and young")
	if n, e := l.Refused(), l.Evicted(); n != 1 || e != 0 {
		t.Errorf("Refused() = %d, Evicted() = %d; want 1 and 0", n, e)
	}
}

// Connections that wait for their first request longer than Grace (a
// flood that connects and sends nothing, a header a byte at a time) make
// room for a new one, the one that has waited longest first.
func TestConnectionsWaitingPastGraceMakeRoom(t *testing.T) {
	l, got := listen(t, connlimit.Limits{Total: 2, PerAddr: 2, Grace: 50 * time.Millisecond})
	oldest := dial(t, "127.0.0.2", l.Addr())
	accepted(t, got, "the first")
	time.Sleep(10 * time.Millisecond)
	younger := dial(t, "127.0.0.2", l.Addr())
	accepted(t, got, "the second")
	time.Sleep(100 * time.Millisecond) // both past Grace
	dial(t, "127.0.0.3", l.Addr())
	accepted(t, got, "a third, in place of the oldest")
	_ = oldest.SetReadDeadline(time.Now().Add(soon))
	if _, err := oldest.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the oldest waiting connection: %v; want it reset to make room", err)
	}
	_ = younger.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := younger.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the younger one: %v; want it left open", err)
	}
	if e := l.Evicted(); e != 1 {
		t.Errorf("Evicted() = %d, want 1", e)
	}
}

// serveHTTP serves h on a connlimit listener with its ConnState, as the
// sidecar's and the webhook's servers do.
func serveHTTP(t *testing.T, lim connlimit.Limits, h http.Handler) (*connlimit.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.Listen(ln, lim)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: soon, ConnState: l.ConnState}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l, "http://" + ln.Addr().String() + "/"
}

// keptAlive is a client from the loopback address from that keeps its one
// connection alive between requests.
func keptAlive(from string) *http.Client {
	return &http.Client{Timeout: soon, Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext}}
}

func get(c *http.Client, url string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// Kept-alive connections idle between requests (a flood that holds its
// slots with a request now and then, enough to take every webhook and
// probe slot) make room for a new client at once, Grace or
// not, the one idle longest first; a connection in the middle of a request
// is never closed, and a new one is then reset.
func TestIdleConnectionsMakeRoomActiveOnesNever(t *testing.T) {
	release, entered := make(chan struct{}), make(chan struct{}, 2)
	l, url := serveHTTP(t, connlimit.Limits{Total: 2, PerAddr: 2, Grace: time.Hour}, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			entered <- struct{}{}
			<-release
		}
	}))
	first, second := keptAlive("127.0.0.2"), keptAlive("127.0.0.3")
	if err := get(first, url); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // idle, and longer than the second
	if err := get(second, url); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	// Both idle: a newcomer takes the place of the first.
	if err := get(keptAlive("127.0.0.4"), url); err != nil {
		t.Fatalf("a newcomer with every slot idle: %v; want it served", err)
	}
	if e := l.Evicted(); e != 1 {
		t.Errorf("Evicted() = %d, want 1", e)
	}
	// The server marks a connection idle just after its answer is written,
	// which the client may read first.
	time.Sleep(50 * time.Millisecond)
	// Two requests under way hold both slots: a newcomer is reset, and
	// they are answered.
	done := make(chan error, 2)
	for _, c := range []*http.Client{keptAlive("127.0.0.5"), keptAlive("127.0.0.6")} {
		go func() { done <- get(c, url+"?hold=1") }()
		select { // one at a time: the second takes the other idle slot
		case <-entered:
		case err := <-done:
			t.Fatalf("a request to hold: %v", err)
		case <-time.After(soon):
			t.Fatal("a request to hold did not reach the handler")
		}
	}
	for deadline := time.Now().Add(soon); l.Refused() == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		_ = get(&http.Client{Timeout: 200 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}, url)
	}
	if l.Refused() == 0 {
		t.Error("a newcomer while both slots served requests: not reset")
	}
	close(release)
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("a request under way: %v; want it answered", err)
		}
	}
}

// Unix socket connections have no address: the total alone bounds them.
func TestUnixSocketsCountAgainstTheTotalOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.Listen(ln, connlimit.Limits{Total: 3, PerAddr: 1, Grace: time.Hour})
	got := server(t, l)
	for range 3 {
		dial(t, "", l.Addr())
		accepted(t, got, "a Unix socket connection within the total")
	}
	c := dial(t, "", l.Addr())
	_ = c.SetReadDeadline(time.Now().Add(soon))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a 4th Unix socket connection with 3 open and young: %v; want it closed", err)
	}
}

func TestLimitsBelowOnePanic(t *testing.T) {
	for _, lim := range []connlimit.Limits{{Total: 0, PerAddr: 1}, {Total: 1, PerAddr: 0}, {Total: 1, PerAddr: 1, Grace: -1}} {
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
