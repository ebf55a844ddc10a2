package prestop_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/internal/sockettest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

// testToken is the pod's token in these tests.
const testToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// sequence is a Sequence that counts its runs and waits for release, if
// set, before it answers.
type sequence struct {
	runs    atomic.Int32
	release chan struct{}
}

func (s *sequence) Shutdown(ctx context.Context, trigger protocol.Trigger) (*protocol.Report, error) {
	s.runs.Add(1)
	if s.release != nil {
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	return &protocol.Report{Trigger: trigger, Outcome: protocol.OutcomeDrained}, nil
}

// A call that is not signed with the pod's token (none, the token as a
// bearer token, another token's signature) or that is sent again as it was
// is answered 401 with a JSON error and starts no sequence; Call says so,
// and signed with the token it runs.
func TestHandlerRequiresASignedCall(t *testing.T) {
	seq := &sequence{}
	control, _ := sockettest.Serve(t, "control.sock", prestop.Handler(seq, protocol.NewVerifier(testToken, nil)))
	client := &http.Client{Transport: control.Transport(0, 0)}
	var replay http.Header
	for _, tc := range []struct {
		what string
		sign func(*http.Request)
	}{
		{"no Authorization", func(*http.Request) {}},
		{"the token as a bearer token", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+testToken) }},
		{"another token's signature", func(r *http.Request) { protocol.Sign(r, strings.Repeat("0", 64), nil, time.Now()) }},
		{"a signed call sent again", func(r *http.Request) { r.Header = replay }},
	} {
		if replay == nil && tc.what == "a signed call sent again" {
			t.Fatal("no call to replay")
		}
		req, _ := http.NewRequest(http.MethodPost, control.URL()+protocol.PreStopPath, nil)
		tc.sign(req)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error string }
		derr := json.NewDecoder(resp.Body).Decode(&e)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || derr != nil || !strings.Contains(e.Error, protocol.TokenFileEnv) {
			t.Errorf("%s: %s, error %q (%v); want 401 with a JSON error naming %s", tc.what, resp.Status, e.Error, derr, protocol.TokenFileEnv)
		}
		if replay == nil {
			// A genuine call, whose headers the last case sends again.
			req, _ := http.NewRequest(http.MethodPost, control.URL()+protocol.PreStopPath, nil)
			protocol.Sign(req, testToken, nil, time.Now())
			resp, err := client.Do(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("a signed call: %v, %v", resp, err)
			}
			_ = resp.Body.Close()
			replay = req.Header.Clone()
		}
	}
	if _, err := prestop.Call(context.Background(), control, strings.Repeat("1", 64), time.Second); !errors.Is(err, prestop.ErrUnauthorized) {
		t.Errorf("Call with another token: %v; want ErrUnauthorized", err)
	}
	if n := seq.runs.Load(); n != 1 {
		t.Fatalf("%d sequences started; want 1, the genuine call's", n)
	}
	if rep, err := prestop.Call(context.Background(), control, testToken, time.Second); err != nil || rep.Outcome != protocol.OutcomeDrained {
		t.Fatalf("Call with the token: %+v, %v", rep, err)
	}
	if n := seq.runs.Load(); n != 2 {
		t.Errorf("%d sequences; want 2", n)
	}
}

// A status read is a signed call too: the sequence's state is not for a
// process that cannot sign.
func TestGetStatusIsSigned(t *testing.T) {
	h := protocol.Signed(protocol.NewVerifier(testToken, nil), 1<<10, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(protocol.Status{Identity: "p_u", Phase: protocol.PhaseRunning})
	}))
	control, _ := sockettest.Serve(t, "control.sock", h)
	st, err := prestop.GetStatus(context.Background(), control, testToken)
	if err != nil || st.Identity != "p_u" {
		t.Fatalf("GetStatus = %+v, %v", st, err)
	}
	if _, err := prestop.GetStatus(context.Background(), control, strings.Repeat("1", 64)); !errors.Is(err, prestop.ErrUnauthorized) {
		t.Errorf("GetStatus with another token: %v; want ErrUnauthorized", err)
	}
}

// The preStop call waits for the whole sequence: the server's read and
// write timeouts, which cut off slow clients, do not cut it (a read
// deadline that passed would cancel the call's context: net/http's wait
// for the client to go away fails with it). Here the timeouts are short and
// the sequence goes on past them.
func TestLongCallOutlivesTheServersTimeouts(t *testing.T) {
	seq := &sequence{release: make(chan struct{})}
	srv := httptest.NewUnstartedServer(prestop.Handler(seq, protocol.NewVerifier(testToken, nil)))
	srv.Config.ReadTimeout, srv.Config.WriteTimeout, srv.Config.ReadHeaderTimeout = 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	srv.Start()
	defer srv.Close()
	go func() {
		for seq.runs.Load() == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond) // five times the timeouts
		close(seq.release)
	}()
	rep, err := prestop.Call(context.Background(), protocol.Endpoint{Network: "tcp", Address: srv.Listener.Addr().String()}, testToken, time.Second)
	if err != nil || rep.Outcome != protocol.OutcomeDrained {
		t.Fatalf("Call across the server's timeouts: %+v, %v; want the report", rep, err)
	}
}
