package protocol_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// seenCall is one call as a raw HTTP/1.1 server read it off its
// connection.
type seenCall struct {
	conn int // which connection, in the order accepted
	req  *http.Request
	body []byte
	// buffered is how many bytes were waiting on the connection after the
	// call was read whole and before it was answered: a pipelined call.
	buffered int
}

// rawApp is an app server of its own on loopback TCP: it reads each call
// with http.ReadRequest, records it, and answers 200 with answer, after
// hold returns.
type rawApp struct {
	ln     net.Listener
	hold   func()
	answer func(*http.Request) string
	mu     sync.Mutex
	calls  []seenCall
	conns  int
}

func newRawApp(t *testing.T, answer func(*http.Request) string) *rawApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &rawApp{ln: ln, hold: func() {}, answer: answer}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.mu.Lock()
			a.conns++
			n := a.conns
			a.mu.Unlock()
			t.Cleanup(func() { _ = c.Close() })
			go a.serve(c, n)
		}
	}()
	return a
}

func (a *rawApp) serve(c net.Conn, n int) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		a.mu.Lock()
		hold := a.hold
		a.mu.Unlock()
		hold()
		a.mu.Lock()
		a.calls = append(a.calls, seenCall{conn: n, req: req, body: body, buffered: br.Buffered()})
		a.mu.Unlock()
		out := a.answer(req)
		if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(out), out); err != nil {
			return
		}
	}
}

func (a *rawApp) seen() []seenCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]seenCall(nil), a.calls...)
}

func answerFor(r *http.Request) string {
	switch {
	case strings.HasPrefix(r.URL.Path, protocol.LeasePathPrefix):
		return `{"leader": true}`
	case r.URL.Path == protocol.ReturnPath:
		return `{"returned": 0}`
	}
	return `{"stopping": false, "inFlight": 0, "drained": true}`
}

// The sidecar's client keeps to the HTTP subset docs/protocol.md promises
// ("HTTP: what the sidecar sends and accepts"): HTTP/1.1, bodies framed by
// Content-Length alone (no chunked, no Expect: 100-continue), a JSON
// Content-Type on a body, none on a call without one, the three signing
// headers, an origin-form target, kept-alive connections reused one call
// at a time, and concurrent calls on connections of their own, never
// pipelined.
func TestAppClientSpeaksTheSubset(t *testing.T) {
	app := newRawApp(t, answerFor)
	e, err := protocol.ParseEndpoint("http://" + app.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := protocol.NewAppClient(e, strings.Repeat("t", 32))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// One after another: one connection, kept alive.
	if _, err := c.StopClaiming(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Drain(ctx, 250*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := c.SetLeadership(ctx, protocol.Leadership{Lease: "orders", Leader: true, Sequence: 1, FencingToken: 1, ValidForMillis: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Return(ctx, true, time.Second); err != nil {
		t.Fatal(err)
	}
	calls := app.seen()
	if len(calls) != 4 {
		t.Fatalf("the app read %d calls, want 4", len(calls))
	}
	for _, sc := range calls {
		r := sc.req
		what := r.Method + " " + r.RequestURI
		if r.Proto != "HTTP/1.1" {
			t.Errorf("%s: %s, want HTTP/1.1", what, r.Proto)
		}
		if !strings.HasPrefix(r.RequestURI, "/") {
			t.Errorf("%s: request target not in origin form", what)
		}
		if len(r.TransferEncoding) != 0 {
			t.Errorf("%s: Transfer-Encoding %v, want none: bodies are framed by Content-Length", what, r.TransferEncoding)
		}
		if v := r.Header.Get("Expect"); v != "" {
			t.Errorf("%s: Expect %q, want none", what, v)
		}
		for _, h := range []string{"Authorization", protocol.TimestampHeader, protocol.NonceHeader} {
			if r.Header.Get(h) == "" {
				t.Errorf("%s: no %s header", what, h)
			}
		}
		if r.Method == http.MethodGet {
			if len(sc.body) != 0 || r.Header.Get("Content-Length") != "" || r.Header.Get("Content-Type") != "" {
				t.Errorf("%s: a call without a body has body %q, Content-Length %q, Content-Type %q; want none", what, sc.body, r.Header.Get("Content-Length"), r.Header.Get("Content-Type"))
			}
			continue
		}
		if r.ContentLength != int64(len(sc.body)) || r.Header.Get("Content-Length") == "" {
			t.Errorf("%s: Content-Length %q for a body of %d bytes", what, r.Header.Get("Content-Length"), len(sc.body))
		}
		if len(sc.body) >= 1<<10 {
			t.Errorf("%s: a body of %d bytes, want under 1 KiB", what, len(sc.body))
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q, want application/json", what, ct)
		}
	}
	for _, sc := range calls {
		if sc.conn != 1 {
			t.Errorf("%s %s on connection %d: calls one after another want the one kept-alive connection", sc.req.Method, sc.req.RequestURI, sc.conn)
		}
	}

	// At once: each on a connection of its own, none sent on a connection
	// before the answer to the call before it there.
	const n = 3
	var arrived sync.WaitGroup
	arrived.Add(n)
	release := make(chan struct{})
	app.mu.Lock()
	app.hold = func() { arrived.Done(); <-release }
	app.mu.Unlock()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Drain(ctx, 0)
			errs <- err
		}()
	}
	arrived.Wait() // all n read while none is answered: n connections
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	conns := map[int]bool{}
	for _, sc := range app.seen()[4:] {
		conns[sc.conn] = true
		if sc.buffered != 0 {
			t.Errorf("connection %d had %d bytes of another call waiting before its answer: pipelined", sc.conn, sc.buffered)
		}
	}
	if len(conns) != n {
		t.Errorf("%d calls at once went on %d connections, want %d: one call at a time on a connection", n, len(conns), n)
	}
}
