package prestop_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

// FuzzCall has prestop.Call ask a sidecar that answers a fuzzed status and
// body. It checks that anything but 200 is an error naming the status, that
// a 200 gives a Report only from a body json.Unmarshal reads as one (and
// then the same Report), and a "decoding report" error otherwise.
//
// Run: go test ./prestop -run '^$' -fuzz FuzzCall (or hack/fuzz.sh).
func FuzzCall(f *testing.F) {
	report := `{"trigger":"preStop","started":"2026-01-02T03:04:05Z","deadline":"2026-01-02T03:04:30Z","deadlineSource":"deletionTimestamp","outcome":"Returned","inFlightAtDeadline":2,"returned":2,"leases":[{"lease":"work","wasLeader":true,"released":true}],"steps":[{"name":"stop-claiming","at":"2026-01-02T03:04:05Z"}],"finished":"2026-01-02T03:04:07Z"}`
	for _, s := range []struct {
		status uint16
		body   string
	}{
		{0, report},
		{0, `{"outcome":"Drained","errors":["release work: conflict"]}`},
		{0, `{"started":"yesterday"}`},
		{0, `{"leases":{}}`},
		{0, `null`},
		{0, ``},
		{0, report + "\n" + report},
		{303, "shutdown: context canceled\n"},
		{205, report},
		{4, report},
	} {
		f.Add(s.status, []byte(s.body))
	}
	var (
		mu     sync.Mutex
		status int
		body   []byte
		sent   []byte
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		// Call makes a client per call: close each connection, or they pile up.
		w.Header().Set("Connection", "close")
		w.WriteHeader(status)
		sent = body
		if _, err := w.Write(body); err != nil {
			sent = nil
		}
	}))
	f.Cleanup(srv.Close)
	addr := protocol.Endpoint{Network: "tcp", Address: srv.Listener.Addr().String()}
	f.Fuzz(func(t *testing.T, code uint16, b []byte) {
		mu.Lock()
		status, body = 200+int(code)%400, b
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rep, err := prestop.Call(ctx, addr, testToken, time.Second)
		mu.Lock()
		code2, got := status, sent
		mu.Unlock()
		if (rep == nil) == (err == nil) {
			t.Fatalf("report %v and error %v: want exactly one", rep, err)
		}
		if code2 != http.StatusOK {
			if err == nil || !strings.Contains(err.Error(), strconv.Itoa(code2)) {
				t.Fatalf("status %d: error %v, want one naming the status", code2, err)
			}
			return
		}
		var want protocol.Report
		if jerr := json.Unmarshal(got, &want); jerr != nil {
			if err == nil || !strings.Contains(err.Error(), "decoding report") {
				t.Fatalf("body %q (%v): error %v, want a decoding error", got, jerr, err)
			}
			return
		}
		if err != nil || !reflect.DeepEqual(*rep, want) {
			t.Fatalf("body %q: report %+v, %v; json.Unmarshal reads %+v", got, rep, err, want)
		}
	})
}
