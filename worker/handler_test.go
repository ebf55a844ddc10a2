package worker_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"bytes"
	"fmt"
	"math"
	"time"

	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// call sends one request and returns the status and body.
func call(t *testing.T, srv *httptest.Server, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	sign(req, body)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestBodiesAreOneJSONValueOfBoundedSize(t *testing.T) {
	srv := httptest.NewServer(newAgent(t, worker.Options{}).Handler())
	defer srv.Close()
	lease := protocol.LeasePathPrefix + "l"
	big := `{"cancel": false, "pad": "` + strings.Repeat("x", worker.MaxBodyBytes) + `"}`
	for _, tc := range []struct {
		name, method, path, body string
		code                     int
		says                     string // in the error
	}{
		{"return", "POST", protocol.ReturnPath, `{"cancel": false}`, 200, ""},
		{"unknown fields are tolerated", "POST", protocol.ReturnPath, `{"cancel": false, "fromTheFuture": [1, 2]}`, 200, ""},
		{"white space after the value", "POST", protocol.ReturnPath, "{\"cancel\": false}\n\t \n", 200, ""},
		{"too large", "POST", protocol.ReturnPath, big, 413, "larger than 65536 bytes"},
		{"too large lease", "PUT", lease, `{"lease": "l", "leader": false, "x": "` + strings.Repeat("x", worker.MaxBodyBytes) + `"}`, 413, "larger than 65536 bytes"},
		{"trailing garbage", "POST", protocol.ReturnPath, `{"cancel": false}garbage`, 400, "data after the JSON value"},
		{"second value", "POST", protocol.ReturnPath, `{"cancel": false} {"cancel": true}`, 400, "data after the JSON value"},
		{"trailing garbage on a lease", "PUT", lease, `{"lease": "l", "leader": false, "sequence": 1}]`, 400, "data after the JSON value"},
		{"empty", "POST", protocol.ReturnPath, ``, 400, "body: empty"},
		{"wrong type", "PUT", lease, `{"leader": "yes"}`, 400, "leader"},
		{"not JSON", "PUT", lease, `leader=true`, 400, "want one JSON object"},
		{"lease differs from the path", "PUT", lease, `{"lease": "m"}`, 400, `lease "m" differs from the path's Lease "l"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := call(t, srv, tc.method, tc.path, tc.body)
			if code != tc.code {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, code, body, tc.code)
			}
			if tc.says == "" {
				return
			}
			var e struct{ Error string }
			if err := json.Unmarshal([]byte(body), &e); err != nil || !strings.Contains(e.Error, tc.says) {
				t.Fatalf("error = %q (%v), want it to say %q", body, err, tc.says)
			}
		})
	}
}

func TestWaitMillisEdgeValues(t *testing.T) {
	for _, tc := range []struct {
		query string
		code  int
		says  string
	}{
		{"", 200, ""},
		{"?waitMillis=", 200, ""},
		{"?waitMillis=0", 200, ""},
		{"?waitMillis=%205%20", 200, ""},
		{"?waitMillis=30001", 200, ""},
		{"?waitMillis=9223372036854775807", 200, ""},
		{"?waitMillis=99999999999999999999999", 200, ""},
		{"?waitMillis=-1", 400, `waitMillis "-1": want a whole number of milliseconds, 0 or more`},
		{"?waitMillis=-99999999999999999999999", 400, "want a whole number"},
		{"?waitMillis=soon", 400, `waitMillis "soon"`},
		{"?waitMillis=1.5", 400, `waitMillis "1.5"`},
		{"?waitMillis=1e3", 400, `waitMillis "1e3"`},
		{"?waitMillis=1&waitMillis=2", 400, "waitMillis given 2 times; want it once"},
	} {
		// A drained app answers every accepted wait at once.
		srv := httptest.NewServer(newAgent(t, worker.Options{}).Handler())
		code, body := call(t, srv, "GET", protocol.DrainPath+tc.query, "")
		srv.Close()
		var e struct{ Error string }
		_ = json.Unmarshal([]byte(body), &e)
		if code != tc.code || !strings.Contains(e.Error, tc.says) {
			t.Errorf("GET drain%s = %d %s, want %d saying %q", tc.query, code, body, tc.code, tc.says)
		}
	}
}

// A wait above the bound, however large, waits (up to the bound) rather
// than answering at once: until the claim is done, here.
func TestHugeWaitMillisWaitsForTheDrain(t *testing.T) {
	for _, v := range []string{"30001", "9223372036854775807", "99999999999999999999"} {
		a := newAgent(t, worker.Options{})
		entered := make(chan struct{}, 1)
		h := a.Handler()
		app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			h.ServeHTTP(w, r)
		}))
		_, done, err := a.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		answered := make(chan string, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodGet, app.URL+protocol.DrainPath+"?waitMillis="+v, nil)
			sign(req, "")
			resp, err := app.Client().Do(req)
			if err != nil {
				answered <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			answered <- string(b)
		}()
		<-entered // the request is in the handler: it answers drained only if it waits
		done()
		if body := <-answered; !strings.Contains(body, `"drained":true`) {
			t.Errorf("waitMillis=%s answered %s before the claim was done, want the long poll to wait for drained", v, body)
		}
		app.Close()
	}
}

// countingConn counts the writes to the connection.
type countingConn struct {
	net.Conn
	mu     *sync.Mutex
	writes *int
}

func (c countingConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	*c.writes++
	c.mu.Unlock()
	return c.Conn.Write(b)
}

type countingListener struct {
	net.Listener
	mu     sync.Mutex
	writes int
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, mu: &l.mu, writes: &l.writes}, nil
}

// Each answer reaches the connection in one write: status line, headers
// and body together, so no answer waits on Nagle's algorithm and the
// caller's delayed ACK.
func TestEachAnswerIsOneWrite(t *testing.T) {
	a := newAgent(t, worker.Options{})
	srv := httptest.NewUnstartedServer(a.Handler())
	ln := &countingListener{Listener: srv.Listener}
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	calls := []struct{ method, path, body string }{
		{"PUT", protocol.LeasePathPrefix + "l", `{"lease":"l","leader":true,"sequence":1,"fencingToken":1,"validForMillis":60000}`},
		{"PUT", protocol.LeasePathPrefix + "l", `{"lease":"l","leader":false,"sequence":2}`},
		{"POST", protocol.StopClaimingPath, `{}`},
		{"GET", protocol.DrainPath + "?waitMillis=10", ""},
		{"POST", protocol.ReturnPath, `{"cancel":true,"cancelWaitMillis":10}`},
		{"GET", protocol.DrainPath + "?waitMillis=x", ""},
		{"POST", protocol.ReturnPath, `{}x`},
	}
	for i, c := range calls {
		code, body := call(t, srv, c.method, c.path, c.body)
		ln.mu.Lock()
		n := ln.writes
		ln.mu.Unlock()
		if n != i+1 {
			t.Fatalf("after answer %d (%s %s = %d %s): %d writes to the connection, want %d", i+1, c.method, c.path, code, body, n, i+1)
		}
	}
}

// Bad input to the app API (a body over the limit, two JSON values or data
// after one, an empty body, null or [] for an object, a field of the wrong
// type, another Lease than the path, a negative cancelWaitMillis or
// waitMillis, a method the path does not take) is answered with a 4xx,
// never a 2xx, a 5xx or a hang, and does not stop claiming.
func TestBadInputIsAnswered4xx(t *testing.T) {
	a := newAgent(t, worker.Options{})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	big := `{"leader":false,"lease":"` + strings.Repeat("x", worker.MaxBodyBytes) + `"}`
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodPut, protocol.LeasePathPrefix + "work", big},
		{http.MethodPut, protocol.LeasePathPrefix + "work", `{"leader":true,"sequence":1}{"leader":true,"sequence":2}`},
		{http.MethodPut, protocol.LeasePathPrefix + "work", `{"leader":true,"sequence":1} x`},
		{http.MethodPut, protocol.LeasePathPrefix + "work", ``},
		{http.MethodPut, protocol.LeasePathPrefix + "work", `null`},
		{http.MethodPut, protocol.LeasePathPrefix + "work", `[]`},
		{http.MethodPut, protocol.LeasePathPrefix + "work", `{"leader":"yes"}`},
		{http.MethodPut, protocol.LeasePathPrefix + "work", `{"lease":"other","leader":true,"sequence":1}`},
		{http.MethodPost, protocol.ReturnPath, big},
		{http.MethodPost, protocol.ReturnPath, `{"cancel":true}{}`},
		{http.MethodPost, protocol.ReturnPath, `{"cancelWaitMillis":-5}`},
		{http.MethodGet, protocol.DrainPath + "?waitMillis=-1", ``},
		{http.MethodGet, protocol.DrainPath + "?waitMillis=abc", ``},
		{http.MethodDelete, protocol.StopClaimingPath, ``},
		{http.MethodGet, protocol.StopClaimingPath, ``},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		sign(req, tc.body)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		cancel()
		if err != nil {
			t.Errorf("%s %s %.40q: %v", tc.method, tc.path, tc.body, err)
			continue
		}
		msg, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode/100 != 4 {
			t.Errorf("%s %s %.40q: %s %s; want a 4xx", tc.method, tc.path, tc.body, resp.Status, bytes.TrimSpace(msg))
		} else {
			t.Logf("%s %s %.40q: %s %s", tc.method, tc.path, tc.body, resp.Status, bytes.TrimSpace(msg))
		}
	}
	if _, err := a.Receive(context.Background()); err != nil {
		t.Errorf("bad input stopped claiming: %v", err)
	}
}

// A leadership message the sidecar cannot have sent, even one signed with
// the token (a stolen token): a sequence far ahead of the Agent's clock, or
// a grant longer than the lease duration. Applied, the first would make
// every later revoke stale, and the worker would go on leading with the
// message's fencing token while the Lease moved. Each is answered 422 and
// changes nothing; the sidecar's revoke then ends the term.
func TestImpossibleLeadershipIsRefused(t *testing.T) {
	a := newAgent(t, worker.Options{LeaseDuration: 15 * time.Second})
	app := serve(t, a)
	now := time.Now()
	if err := app.SetLeadership(context.Background(), protocol.Leadership{Lease: "work", Leader: true, Sequence: now.UnixNano(),
		FencingToken: 3, Until: now.Add(10 * time.Second), ValidForMillis: 10000}); err != nil {
		t.Fatal(err)
	}
	for _, l := range []protocol.Leadership{
		{Lease: "work", Leader: true, Sequence: now.Add(time.Hour).UnixNano(), FencingToken: 99, Until: now.Add(10 * time.Second), ValidForMillis: 10000},
		{Lease: "work", Leader: true, Sequence: math.MaxInt64, FencingToken: 99, Until: now.Add(10 * time.Second), ValidForMillis: 10000},
		{Lease: "work", Leader: false, Sequence: now.Add(protocol.MaxSequenceAhead + time.Minute).UnixNano()},
		{Lease: "work", Leader: true, Sequence: now.UnixNano() + 1, FencingToken: 99, Until: now.Add(16 * time.Second), ValidForMillis: 10000},
		{Lease: "work", Leader: true, Sequence: now.UnixNano() + 2, FencingToken: 99, Until: now.Add(10 * time.Second), ValidForMillis: 15001},
		{Lease: "work", Leader: true, Sequence: now.UnixNano() + 3, FencingToken: 99, ValidForMillis: 24 * 3600 * 1000},
	} {
		err := app.SetLeadership(context.Background(), l)
		if err == nil || !strings.Contains(err.Error(), "422") {
			t.Errorf("%+v: %v; want 422", l, err)
		}
		if lead, ok := a.Leader("work"); !ok || lead.FencingToken != 3 {
			t.Errorf("after %+v: Leader = %+v, %v; want the sidecar's term, fencing token 3", l, lead, ok)
		}
	}
	revoke := protocol.Leadership{Lease: "work", Leader: false, Sequence: time.Now().UnixNano()}
	if err := app.SetLeadership(context.Background(), revoke); err != nil {
		t.Fatalf("the sidecar's revoke: %v; want it applied (not stale)", err)
	}
	if _, ok := a.Leader("work"); ok {
		t.Error("still leader after the sidecar's revoke")
	}
}

// A grant and a later revoke of one Lease handled at once (the sidecar gave
// up on a grant the stalled worker still handles, and sends the revoke on
// another connection): whatever the interleaving, once the revoke is
// acknowledged (not stale) the worker does not lead. A grant checked apart
// from its change could pass its check before the revoke and apply after
// the revoke's ack: the sidecar would then free the Lease under a worker
// that still leads. The interleaving is rare, so the test repeats it.
func TestLateGrantNeverOvertakesAnAcknowledgedRevoke(t *testing.T) {
	a := newAgent(t, worker.Options{LeaseDuration: 15 * time.Second})
	h := a.Handler()
	call := func(l protocol.Leadership) (int, protocol.LeadershipAck) {
		body, _ := json.Marshal(l)
		r := httptest.NewRequest(http.MethodPut, protocol.LeasePathPrefix+l.Lease, bytes.NewReader(body))
		sign(r, string(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var ack protocol.LeadershipAck
		_ = json.Unmarshal(w.Body.Bytes(), &ack)
		return w.Code, ack
	}
	trials, bad := 0, 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); trials++ {
		lease := fmt.Sprintf("l%d", trials)
		now := time.Now()
		var wg sync.WaitGroup
		var code int
		var ack protocol.LeadershipAck
		wg.Add(1)
		go func() {
			defer wg.Done()
			call(protocol.Leadership{Lease: lease, Leader: true, Sequence: now.UnixNano(), FencingToken: 3, Until: now.Add(10 * time.Second), ValidForMillis: 10000})
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, ack = call(protocol.Leadership{Lease: lease, Leader: false, Sequence: now.UnixNano() + 1})
		}()
		wg.Wait()
		if _, leading := a.Leader(lease); leading && code == http.StatusOK && !ack.Stale {
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d: the worker leads after acknowledging a revoke later than the grant", bad, trials)
	}
	t.Logf("%d grant-and-revoke races, none leading after the revoke's ack", trials)
}
