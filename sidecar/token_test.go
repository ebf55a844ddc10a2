package sidecar_test

import (
	"testing"

	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/sockettest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// testToken is the pod's token in these tests, the sidecar's and the
// worker's.
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

// A process that reaches the control and app sockets but cannot sign with
// the pod's token (no header, a bearer token, another token's signature):
// its POST /v1/prestop is answered 401 with a JSON error and starts
// nothing: the sidecar keeps running, the app is never told to stop
// claiming, the Lease stays held. Its calls to the app are answered 401
// too, and the app's term and claiming are unchanged. Every call the
// sidecar itself makes to the app is signed. Then the hook, signing with
// the token, hands over.
func TestNeighbourWithoutASignatureStartsNothing(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := startPod(t, env.Pod(t, ns, "pod-a", 30), nil, worker.Options{}, nil)
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	inner := *p.app.Load()
	var unsigned atomic.Int32
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !strings.HasPrefix(req.Header.Get("Authorization"), protocol.AuthScheme+" ") || req.Header.Get(protocol.NonceHeader) == "" {
			unsigned.Add(1)
		}
		inner.ServeHTTP(w, req)
	})
	p.app.Store(&h)
	control, _ := sockettest.Serve(t, "control.sock", p.c.ControlHandler())

	lead, _ := p.agent.Leader(lease)
	later := strconv.FormatInt(time.Now().Add(protocol.MaxSequenceAhead/2).UnixNano(), 10)
	other := strings.Repeat("a", 64)
	for _, sg := range []struct {
		what string
		sign func(r *http.Request, body string)
	}{
		{"no Authorization", func(*http.Request, string) {}},
		{"the token as a bearer token", func(r *http.Request, _ string) { r.Header.Set("Authorization", "Bearer "+testToken) }},
		{"another token's signature", func(r *http.Request, body string) { protocol.Sign(r, other, []byte(body), time.Now()) }},
	} {
		for _, c := range []struct {
			to           protocol.Endpoint
			method, path string
			body         string
		}{
			{control, http.MethodPost, protocol.PreStopPath, ``},
			{control, http.MethodGet, protocol.StatusPath, ``},
			{p.appAddr, http.MethodPost, protocol.StopClaimingPath, `{}`},
			{p.appAddr, http.MethodPut, protocol.LeasePathPrefix + lease, `{"leader":false,"sequence":` + later + `}`},
			{p.appAddr, http.MethodPut, protocol.LeasePathPrefix + lease, `{"leader":true,"fencingToken":99,"validForMillis":2000,"sequence":` + later + `}`},
		} {
			req, _ := http.NewRequest(c.method, c.to.URL()+c.path, strings.NewReader(c.body))
			sg.sign(req, c.body)
			resp, err := (&http.Client{Transport: c.to.Transport(0, 0)}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var e struct{ Error string }
			derr := json.NewDecoder(resp.Body).Decode(&e)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || derr != nil || e.Error == "" {
				t.Errorf("%s, %s %s %s: %s (%v); want 401 with a JSON error", sg.what, c.method, c.to, c.path, resp.Status, derr)
			}
		}
	}
	if st := p.c.Status(); st.Phase != protocol.PhaseRunning || st.Report != nil {
		t.Errorf("after the neighbour's preStop: phase %s, report %v; want Running and no sequence", st.Phase, st.Report)
	}
	select {
	case <-p.agent.Stopping():
		t.Error("the neighbour's calls stopped the app's claiming")
	default:
	}
	if now, ok := p.agent.Leader(lease); !ok || now.FencingToken != lead.FencingToken {
		t.Errorf("after the neighbour's calls: Leader = %+v, %v; want the sidecar's term, fencing token %d", now, ok, lead.FencingToken)
	}
	n := unsigned.Load() // the neighbour's own calls to the app
	rep, err := prestop.Call(context.Background(), control, testToken, time.Second)
	if err != nil || rep.Outcome != protocol.OutcomeDrained || len(rep.Errors) > 0 || len(rep.Leases) != 1 || !rep.Leases[0].Released {
		t.Fatalf("the hook, signing with the token: %+v, %v; want Drained, the Lease released", rep, err)
	}
	if got := unsigned.Load() - n; got != 0 || n != 6 {
		t.Errorf("%d of the sidecar's calls to the app were not signed (the neighbour's unsigned: %d of 6); want none", got, n)
	}
}
