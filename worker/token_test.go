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

	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"

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
func TestNeighbourWithoutASignatureIsRefused(t *testing.T) {
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

// A sequence ratchet, on the real Agent over loopback TCP: a neighbour
// that reads the pod's loopback sends, every 100 ms for 2 s, a grant with
// a sequence 900 ms ahead of the clock and fencing token 99 (each one,
// applied, would raise the floor under which the sidecar's revoke is
// stale), unsigned, signed with a guessed token, and as a replay of the
// sidecar's own signed grant it read off the wire with its sequence
// raised. None is applied: the worker keeps the sidecar's term (fencing
// token 3), and the sidecar's first revoke ends it; the revoke replayed
// afterwards is refused too.
func TestSequenceRatchetEndsAtTheFirstGenuineRevoke(t *testing.T) {
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
