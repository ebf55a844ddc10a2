package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// Misuse and races of Receive/Hold/End/Claim under the race detector: Hold
// after End, End twice, Done twice, End before any Hold, and StopClaiming
// racing Receive, Hold and End. Whatever the interleaving, once every claim
// is Done and every receive ended the worker is drained, InFlight is 0, and
// a receive begun before stop-claiming has its Context ended with cause
// ErrStopping (or Canceled, if it was ended first).
func TestBreakReceiveMisuseAndRaces(t *testing.T) {
	for i := 0; i < 200; i++ {
		a := newAgent(t, worker.Options{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var claims []*worker.Claim
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					r, err := a.Receive(context.Background())
					if errors.Is(err, worker.ErrStopping) {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					c1 := r.Hold()
					r.End()
					r.End()
					c2 := r.Hold() // after End: still counted
					c1.Done()
					c1.Done()
					mu.Lock()
					claims = append(claims, c2)
					mu.Unlock()
					select {
					case <-r.Context().Done():
					default:
						t.Error("Context not ended after End")
					}
				}
			}()
		}
		pending, err := a.Receive(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%5) * 10 * time.Microsecond)
		a.StopClaiming()
		if c := context.Cause(pending.Context()); !errors.Is(c, worker.ErrStopping) {
			t.Fatalf("pending receive's cause %v, want ErrStopping", c)
		}
		late := pending.Hold() // a message received in the race with stop-claiming
		pending.End()
		wg.Wait()
		if _, _, err := a.Begin(context.Background()); !errors.Is(err, worker.ErrStopping) {
			t.Fatalf("Begin after StopClaiming: %v", err)
		}
		if _, err := a.Receive(context.Background()); !errors.Is(err, worker.ErrStopping) {
			t.Fatalf("Receive after StopClaiming: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		if a.WaitDrained(ctx) == nil {
			t.Fatal("drained with claims held")
		}
		cancel()
		late.Done()
		for _, c := range claims {
			c.Done()
			c.Done()
		}
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		if err := a.WaitDrained(ctx); err != nil || a.InFlight() != 0 {
			t.Fatalf("after every Done: drained %v, in flight %d", err, a.InFlight())
		}
		cancel()
	}
}

// The cancel fallback ends the Context of claims held, with cause
// ErrCanceled, including one held after End and one held after
// stop-claiming; claims Done before are untouched.
func TestBreakCancelFallbackReachesLateHolds(t *testing.T) {
	a := newAgent(t, worker.Options{})
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	early := r.Hold()
	r.End()
	afterEnd := r.Hold()
	a.StopClaiming()
	afterStop := r.Hold()
	early.Done()
	go func() {
		time.Sleep(20 * time.Millisecond)
		afterEnd.Done()
		afterStop.Done()
	}()
	if _, err := a.Return(context.Background(), true, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*worker.Claim{"after End": afterEnd, "after stop-claiming": afterStop} {
		if cause := context.Cause(c.Context()); !errors.Is(cause, worker.ErrCanceled) {
			t.Errorf("claim held %s: cause %v", name, cause)
		}
	}
	if a.InFlight() != 0 {
		t.Errorf("in flight %d after the cancel fallback", a.InFlight())
	}
}

// Bad input to the app API: every answer is a 4xx naming the problem, never
// a 2xx, a 5xx or a hang. Fails: a body "null" is taken for a revoke (200
// {"leader":false}) where "[]" is refused with "want one JSON object", and
// cancelWaitMillis -5 is taken for 0.
func TestBreakAppAPIBadInput(t *testing.T) {
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

// neighbour sends what another process could send the app on loopback TCP
// (the transport a pod may opt into): a request with the given
// Authorization header ("" for none) and no timestamp or nonce, or, with
// sign, signed by sign. It returns the status and the body.
func neighbour(t *testing.T, url, method, path, auth, body string, sign ...func(*http.Request)) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	for _, s := range sign {
		s(req)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A process that can reach the app but cannot sign with the pod's token
// (no Authorization header, the token itself as a bearer token, another
// token's signature, a signature with its timestamp or nonce changed) gets
// 401 with a JSON error on every call, and the Agent acts on none: it keeps
// claiming, keeps the term it was granted (a revoke, a grant with another
// fencing token and a later sequence), and the sidecar's next revoke is
// applied, not answered stale.
func TestBreakNeighbourWithoutASignatureIsRefused(t *testing.T) {
	a := newAgent(t, worker.Options{})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	app := serve(t, a)
	now := time.Now()
	grant := protocol.Leadership{Lease: "work", Leader: true, Sequence: now.UnixNano(), FencingToken: 3,
		Until: now.Add(10 * time.Second), ValidForMillis: 10000}
	if err := app.SetLeadership(context.Background(), grant); err != nil {
		t.Fatal(err)
	}
	later := now.Add(protocol.MaxSequenceAhead / 2).UnixNano()
	other := strings.Repeat("f", 64)
	signers := []struct {
		what string
		auth string
		sign func(*http.Request, string)
	}{
		{what: "no Authorization"},
		{what: "the token as a bearer token", auth: "Bearer " + testToken},
		{what: "another scheme", auth: "Basic " + testToken},
		{what: "another token's signature", sign: func(r *http.Request, body string) { protocol.Sign(r, other, []byte(body), time.Now()) }},
		{what: "a changed timestamp", sign: func(r *http.Request, body string) {
			sign(r, body)
			r.Header.Set(protocol.TimestampHeader, strconv.FormatInt(time.Now().Add(time.Second).UnixMilli(), 10))
		}},
		{what: "a changed nonce", sign: func(r *http.Request, body string) {
			sign(r, body)
			r.Header.Set(protocol.NonceHeader, protocol.NewNonce())
		}},
	}
	for _, sg := range signers {
		for _, c := range []struct{ method, path, body string }{
			{http.MethodPost, protocol.StopClaimingPath, `{}`},
			{http.MethodPut, protocol.LeasePathPrefix + "work", `{"lease":"work","leader":false,"sequence":` + strconv.FormatInt(later, 10) + `}`},
			{http.MethodPut, protocol.LeasePathPrefix + "work", `{"lease":"work","leader":true,"fencingToken":99,"validForMillis":5000,"sequence":` + strconv.FormatInt(later, 10) + `}`},
			{http.MethodPost, protocol.ReturnPath, `{"cancel":true}`},
			{http.MethodGet, protocol.DrainPath + "?waitMillis=1000", ``},
		} {
			var signs []func(*http.Request)
			if sg.sign != nil {
				signs = append(signs, func(r *http.Request) { sg.sign(r, c.body) })
			}
			code, body := neighbour(t, srv.URL, c.method, c.path, sg.auth, c.body, signs...)
			var e struct{ Error string }
			if code != http.StatusUnauthorized || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error, protocol.TokenFileEnv) {
				t.Errorf("%s, %s %s: %d %s; want 401 with a JSON error naming %s", sg.what, c.method, c.path, code, body, protocol.TokenFileEnv)
			}
		}
	}
	if _, err := a.Receive(context.Background()); err != nil {
		t.Errorf("after the neighbour's stop-claiming: Receive = %v; want claiming to go on", err)
	}
	if lead, ok := a.Leader("work"); !ok || lead.FencingToken != 3 {
		t.Errorf("after the neighbour's revoke and grant: Leader = %+v, %v; want the sidecar's term, fencing token 3", lead, ok)
	}
	revoke := protocol.Leadership{Lease: "work", Leader: false, Sequence: time.Now().UnixNano()}
	if err := app.SetLeadership(context.Background(), revoke); err != nil {
		t.Fatalf("the sidecar's revoke: %v; want it applied", err)
	}
	if _, ok := a.Leader("work"); ok {
		t.Error("still leader after the sidecar's revoke")
	}
}

// wiretap is a proxy between the sidecar and the app on loopback TCP that
// keeps a copy of every call it passes: what a process with CAP_NET_RAW
// reads off the pod's loopback when the pod opts into TCP.
type wiretap struct {
	mu    sync.Mutex
	calls []tapped
}

type tapped struct {
	method, target string
	header         http.Header
	body           []byte
}

func (w *wiretap) proxy(t *testing.T, app string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.mu.Lock()
		w.calls = append(w.calls, tapped{r.Method, r.RequestURI, r.Header.Clone(), body})
		w.mu.Unlock()
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, app+r.RequestURI, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadGateway)
			return
		}
		defer func() { _ = resp.Body.Close() }()
		for k, v := range resp.Header {
			rw.Header()[k] = v
		}
		rw.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(rw, resp.Body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// The attack of issue 20, on the real Agent over loopback TCP: a neighbour
// that reads the pod's loopback sends, every 100 ms for 2 s, a grant with
// a sequence 900 ms ahead of the clock and fencing token 99 (a ratchet:
// each one, applied, raised the floor under which the sidecar's revoke was
// stale), unsigned, signed with a guessed token, and as a replay of the
// sidecar's own signed grant it read off the wire with its sequence
// raised. None is applied: the worker keeps the sidecar's term (fencing
// token 3), and the sidecar's first revoke ends it; the revoke replayed
// afterwards is refused too.
func TestBreakRatchetAttackEndsAtTheFirstGenuineRevoke(t *testing.T) {
	a := newAgent(t, worker.Options{LeaseDuration: 15 * time.Second})
	appSrv := httptest.NewServer(a.Handler())
	defer appSrv.Close()
	var tap wiretap
	wire := tap.proxy(t, appSrv.URL)
	e, err := protocol.ParseEndpoint(wire.URL)
	if err != nil {
		t.Fatal(err)
	}
	sidecarClient := protocol.NewAppClient(e, testToken)
	now := time.Now()
	if err := sidecarClient.SetLeadership(context.Background(), protocol.Leadership{Lease: "work", Leader: true, Sequence: now.UnixNano(),
		FencingToken: 3, Until: now.Add(10 * time.Second), ValidForMillis: 10000}); err != nil {
		t.Fatal(err)
	}
	tap.mu.Lock()
	genuine := tap.calls[0]
	tap.mu.Unlock()

	refused := 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		seq := time.Now().Add(900 * time.Millisecond).UnixNano()
		forged := fmt.Sprintf(`{"lease":"work","leader":true,"fencingToken":99,"validForMillis":10000,"sequence":%d}`, seq)
		for _, send := range []func() (int, string){
			func() (int, string) {
				return neighbour(t, appSrv.URL, http.MethodPut, protocol.LeasePathPrefix+"work", "", forged)
			},
			func() (int, string) {
				return neighbour(t, appSrv.URL, http.MethodPut, protocol.LeasePathPrefix+"work", "", forged, func(r *http.Request) {
					protocol.Sign(r, strings.Repeat("a", 64), []byte(forged), time.Now())
				})
			},
			func() (int, string) { // the genuine grant's headers, its sequence raised
				return neighbour(t, appSrv.URL, genuine.method, genuine.target, "", forged, func(r *http.Request) { r.Header = genuine.header.Clone() })
			},
			func() (int, string) { // the genuine grant as it was
				return neighbour(t, appSrv.URL, genuine.method, genuine.target, "", string(genuine.body), func(r *http.Request) { r.Header = genuine.header.Clone() })
			},
		} {
			if code, body := send(); code != http.StatusUnauthorized {
				t.Fatalf("a forged or replayed grant: %d %s; want 401", code, body)
			}
			refused++
		}
		if lead, ok := a.Leader("work"); !ok || lead.FencingToken != 3 {
			t.Fatalf("during the attack: Leader = %+v, %v; want the sidecar's term, fencing token 3", lead, ok)
		}
	}
	if err := sidecarClient.SetLeadership(context.Background(), protocol.Leadership{Lease: "work", Leader: false, Sequence: time.Now().UnixNano()}); err != nil {
		t.Fatalf("the sidecar's first revoke after %d forged grants: %v; want it applied, not stale", refused, err)
	}
	if _, ok := a.Leader("work"); ok {
		t.Fatal("still leading after the sidecar's first revoke")
	}
	tap.mu.Lock()
	revoke := tap.calls[len(tap.calls)-1]
	tap.mu.Unlock()
	if code, body := neighbour(t, appSrv.URL, revoke.method, revoke.target, "", string(revoke.body), func(r *http.Request) { r.Header = revoke.header.Clone() }); code != http.StatusUnauthorized {
		t.Errorf("the revoke replayed: %d %s; want 401", code, body)
	}
	t.Logf("%d forged and replayed grants refused; the first genuine revoke ended the term", refused)
}

// A leadership message the sidecar cannot have sent, even one with the
// token (a bug, a stolen token): a sequence far ahead of the Agent's clock,
// or a grant longer than the lease duration. Applied, the first made every
// later revoke stale: the worker went on leading with the message's
// fencing token while the Lease moved. Each is answered 422 and changes
// nothing; the sidecar's revoke then ends the term.
func TestBreakImpossibleLeadershipIsRefused(t *testing.T) {
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

// New refuses an Agent with no token unless asked for an insecure one, and
// reads the token file and the lease duration from the variables the
// injector sets.
func TestNewNeedsATokenOrTheInsecureOptOut(t *testing.T) {
	t.Setenv(protocol.TokenFileEnv, "")
	t.Setenv(protocol.LeaseDurationEnv, "")
	if _, err := worker.New(worker.Options{}); err == nil || !strings.Contains(err.Error(), protocol.TokenFileEnv) || !strings.Contains(err.Error(), "InsecureNoToken") {
		t.Errorf("New without a token: %v; want an error naming %s and Options.InsecureNoToken", err, protocol.TokenFileEnv)
	}
	if _, err := worker.New(worker.Options{Token: "short"}); err == nil || !strings.Contains(err.Error(), "Options.Token") {
		t.Errorf("New with a short token: %v; want an error naming Options.Token", err)
	}
	insecure, err := worker.New(worker.Options{InsecureNoToken: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(insecure.Handler())
	defer srv.Close()
	if code, body := neighbour(t, srv.URL, http.MethodPost, protocol.StopClaimingPath, "", `{}`); code != http.StatusOK {
		t.Errorf("insecure Agent: stop-claiming without a token: %d %s; want 200", code, body)
	}

	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(testToken+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(protocol.TokenFileEnv, file)
	t.Setenv(protocol.LeaseDurationEnv, "15s")
	a, err := worker.New(worker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	app := serve(t, a)
	if err := app.SetLeadership(context.Background(), protocol.Leadership{Lease: "l", Leader: true, Sequence: 1, ValidForMillis: 15001}); err == nil || !strings.Contains(err.Error(), "422") {
		t.Errorf("grant over %s=15s: %v; want 422", protocol.LeaseDurationEnv, err)
	}
	if err := app.SetLeadership(context.Background(), protocol.Leadership{Lease: "l", Leader: true, Sequence: 2, ValidForMillis: 14000}); err != nil {
		t.Errorf("grant with the token of %s: %v", protocol.TokenFileEnv, err)
	}
	t.Setenv(protocol.LeaseDurationEnv, "forever")
	if _, err := worker.New(worker.Options{}); err == nil || !strings.Contains(err.Error(), protocol.LeaseDurationEnv) {
		t.Errorf("New with %s=forever: %v; want an error naming it", protocol.LeaseDurationEnv, err)
	}
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(protocol.LeaseDurationEnv, "")
	if _, err := worker.New(worker.Options{}); err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("New with an empty token file: %v; want an error naming the file", err)
	}
}

// ListenAndServe's server cuts off a client that sends its request a byte
// at a time, signed or not (the server closes the connection: the body is
// read, under the read timeout, before the signature is checked), but not
// a signed long poll that waits past its read and write
// timeouts: the poll still answers when the claim it waits for is done.
func TestBreakSlowClientCutOffLongPollNot(t *testing.T) {
	a := newAgent(t, worker.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.ListenAndServe(ctx, addr) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ListenAndServe: %v", err)
		}
	}()
	dial := func() net.Conn {
		for {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				return c
			}
			select {
			case err := <-served:
				t.Fatalf("ListenAndServe: %v", err)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	for _, auth := range []string{"", "Authorization: " + protocol.AuthScheme + " " + strings.Repeat("0", 64) + "\r\n"} {
		conn := dial()
		_, _ = io.WriteString(conn, "PUT "+protocol.LeasePathPrefix+"work HTTP/1.1\r\nHost: app\r\n"+auth+"Content-Length: 1000\r\n\r\n{")
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // one byte every 100ms, until the server closes
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				if _, err := io.WriteString(conn, " "); err != nil {
					return
				}
			}
		}()
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute)) // the test's bound, far beyond the server's
		_, err := io.Copy(io.Discard, conn)
		close(stop)
		wg.Wait()
		_ = conn.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%q: the connection was still open after a minute of a byte every 100ms; want the server to close it", auth)
		}
	}

	_, done, err := a.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	answered := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+protocol.DrainPath+"?waitMillis=30000", nil)
		sign(req, "")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		answered <- string(b)
	}()
	time.Sleep(11 * time.Second) // past the server's read (5s) and write (10s) timeouts
	done()
	if body := <-answered; !strings.Contains(body, `"drained":true`) {
		t.Errorf("a long poll past the server's timeouts answered %q; want it to wait for the claim and answer drained", body)
	}
}

// A grant and a later revoke of one Lease handled at once (the sidecar gave
// up on a grant the stalled worker still handles, and sends the revoke on
// another connection): whatever the interleaving, once the revoke is
// acknowledged (not stale) the worker does not lead. Checked apart from the
// change, the grant could pass its check before the revoke and apply after
// the revoke's ack (a few in 200,000 trials on 2 cores, found by a break
// test of issue 20): the sidecar then frees the Lease under a worker that
// still leads.
func TestBreakLateGrantNeverOvertakesAnAcknowledgedRevoke(t *testing.T) {
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
