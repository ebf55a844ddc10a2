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

// A call without the pod's token (none, another one, another scheme) is
// answered 401 with a JSON error and starts no sequence; Call says so, and
// with the token it runs.
func TestHandlerRequiresTheToken(t *testing.T) {
	seq := &sequence{}
	srv := httptest.NewServer(prestop.Handler(seq, testToken))
	defer srv.Close()
	for _, auth := range []string{"", "Bearer " + strings.Repeat("0", 64), "Basic " + testToken, "Bearer  " + testToken, testToken} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+protocol.PreStopPath, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error string }
		derr := json.NewDecoder(resp.Body).Decode(&e)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || derr != nil || !strings.Contains(e.Error, protocol.TokenFileEnv) {
			t.Errorf("Authorization %q: %s, error %q (%v); want 401 with a JSON error naming %s", auth, resp.Status, e.Error, derr, protocol.TokenFileEnv)
		}
	}
	addr := strings.TrimPrefix(srv.URL, "http://")
	if _, err := prestop.Call(context.Background(), addr, strings.Repeat("1", 64), time.Second); !errors.Is(err, prestop.ErrUnauthorized) {
		t.Errorf("Call with another token: %v; want ErrUnauthorized", err)
	}
	if n := seq.runs.Load(); n != 0 {
		t.Fatalf("%d sequences started without the token; want none", n)
	}
	if rep, err := prestop.Call(context.Background(), addr, testToken, time.Second); err != nil || rep.Outcome != protocol.OutcomeDrained {
		t.Fatalf("Call with the token: %+v, %v", rep, err)
	}
	if n := seq.runs.Load(); n != 1 {
		t.Errorf("%d sequences with the token; want 1", n)
	}
}

// The preStop call waits for the whole sequence: the server's read and
// write timeouts, which cut off slow clients, do not cut it (a read
// deadline that passed would cancel the call's context: net/http's wait
// for the client to go away fails with it). Here the timeouts are short and
// the sequence goes on past them.
func TestLongCallOutlivesTheServersTimeouts(t *testing.T) {
	seq := &sequence{release: make(chan struct{})}
	srv := httptest.NewUnstartedServer(prestop.Handler(seq, testToken))
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
	rep, err := prestop.Call(context.Background(), strings.TrimPrefix(srv.URL, "http://"), testToken, time.Second)
	if err != nil || rep.Outcome != protocol.OutcomeDrained {
		t.Fatalf("Call across the server's timeouts: %+v, %v; want the report", rep, err)
	}
}
