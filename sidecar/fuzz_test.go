package sidecar_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// answer is what a fuzzed app answers, and the body it could send.
type answer struct {
	mu     sync.Mutex
	status int
	body   []byte
	sent   []byte // what reached the client: nothing for a status without a body
}

func (a *answer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w.WriteHeader(a.status)
	a.sent = a.body
	if _, err := w.Write(a.body); err != nil {
		a.sent = nil
	}
}

// FuzzAppClient has the sidecar's AppClient call an app that answers a
// fuzzed status and body, for each of the four calls. It checks that a
// non-2xx answer is an error naming the status, that a 2xx answer decodes
// only from valid JSON of the call's type (and is then exactly what
// json.Unmarshal reads), that anything else is a "decoding answer" error,
// and that a stale leadership ack is protocol.ErrStale. No control plane: kubetest
// starts none while fuzzing.
//
// Run: go test ./sidecar -run '^$' -fuzz FuzzAppClient (or hack/fuzz.sh).
func FuzzAppClient(f *testing.F) {
	for _, s := range []struct {
		call   uint8
		status uint16
		body   string
	}{
		{0, 0, `{"stopping":true,"inFlight":2,"drained":false}`},
		{1, 0, `{"stopping":true,"inFlight":0,"drained":true}`},
		{1, 0, `{"inFlight":"2"}`},
		{1, 0, `{"inFlight":1e3}`},
		{1, 0, `{"inFlight":99999999999999999999}`},
		{2, 0, `{"returned":2,"error":"one claim could not be returned"}`},
		{2, 0, `null`},
		{2, 0, ``},
		{3, 0, `{"leader":true}`},
		{3, 0, `{"leader":true,"stale":true}`},
		{3, 0, `{"leader":true} trailing`},
		{3, 4, `{}`},
		{0, 300, `{"error":"leader work did not stop"}`},
		{1, 204, `{"drained":true}`},
		{2, 104, `{"returned":1}`},
	} {
		f.Add(s.call, s.status, []byte(s.body))
	}
	app := &answer{}
	srv := httptest.NewServer(app)
	f.Cleanup(srv.Close)
	client := protocol.NewAppClient(protocol.Endpoint{Network: "tcp", Address: srv.Listener.Addr().String()}, testToken)
	f.Fuzz(func(t *testing.T, call uint8, status uint16, body []byte) {
		app.mu.Lock()
		app.status, app.body = 200+int(status)%400, body
		app.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()

		var got, want any
		var err error
		switch call % 4 {
		case 0:
			var st protocol.DrainStatus
			st, err = client.StopClaiming(ctx)
			got, want = &st, &protocol.DrainStatus{}
		case 1:
			var st protocol.DrainStatus
			st, err = client.Drain(ctx, time.Second)
			got, want = &st, &protocol.DrainStatus{}
		case 2:
			var res protocol.ReturnResult
			res, err = client.Return(ctx, true, time.Second)
			got, want = &res, &protocol.ReturnResult{}
		case 3:
			err = client.SetLeadership(ctx, protocol.Leadership{Lease: "work", Leader: true, Sequence: 1})
			got, want = nil, &protocol.LeadershipAck{}
		}
		app.mu.Lock()
		code, sent := app.status, app.sent
		app.mu.Unlock()

		if code/100 != 2 {
			if err == nil || !strings.Contains(err.Error(), strconv.Itoa(code)) {
				t.Fatalf("status %d: error %v, want one naming the status", code, err)
			}
			return
		}
		if jerr := json.Unmarshal(sent, want); jerr != nil {
			if err == nil || !strings.Contains(err.Error(), "decoding answer") {
				t.Fatalf("status %d, body %q (%v): error %v, want a decoding error", code, sent, jerr, err)
			}
			return
		}
		if ack, ok := want.(*protocol.LeadershipAck); ok {
			if ack.Stale != errors.Is(err, protocol.ErrStale) || (!ack.Stale && err != nil) {
				t.Fatalf("ack %q: error %v", sent, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("status %d, body %q: %v", code, sent, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("body %q: decoded %+v, json.Unmarshal reads %+v", sent, got, want)
		}
	})
}
