package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// FuzzHandler sends the worker's protocol handler fuzzed requests: method,
// path, query and body, after an optional grant of leadership. It checks
// that the handler answers every protocol route with JSON, a 2xx only when
// the body's JSON value decodes into the route's request type (and, for a
// Lease, names the Lease of the path or none), with the route's answer
// type, and otherwise an {"error": ...} that says why.
//
// Run: go test ./worker -run '^$' -fuzz FuzzHandler (or hack/fuzz.sh).
func FuzzHandler(f *testing.F) {
	leader := `{"lease":"work","leader":true,"fencingToken":3,"validForMillis":5000,"sequence":1}`
	for _, s := range []struct {
		method, path, query, body string
		lead                      bool
	}{
		{"POST", protocol.StopClaimingPath, "", "", false},
		{"GET", protocol.DrainPath, "waitMillis=0", "", false},
		{"GET", protocol.DrainPath, "waitMillis=-1", "", false},
		{"GET", protocol.DrainPath, "waitMillis= 5 ", "", false},
		{"GET", protocol.DrainPath, "waitMillis=99999999999999999999", "", false},
		{"POST", protocol.ReturnPath, "", `{"cancel":true,"cancelWaitMillis":10}`, false},
		{"POST", protocol.ReturnPath, "", `{"cancel":true,"cancelWaitMillis":-9223372036854775808}`, false},
		{"POST", protocol.ReturnPath, "", `{"cancel":"yes"}`, false},
		{"POST", protocol.ReturnPath, "", ``, false},
		{"PUT", protocol.LeasePathPrefix + "work", "", leader, false},
		{"PUT", protocol.LeasePathPrefix + "work", "", `{"lease":"work","leader":false,"sequence":2}`, true},
		{"PUT", protocol.LeasePathPrefix + "work", "", `{"lease":"other","leader":true}`, false},
		{"PUT", protocol.LeasePathPrefix + "work", "", `{"lease":"work","leader":true,"sequence":0}`, true},
		{"PUT", protocol.LeasePathPrefix + "work", "", `{"leader":true,"until":"2000-01-01T00:00:00Z","validForMillis":9223372036854775807}`, false},
		{"PUT", protocol.LeasePathPrefix + "a%2Fb", "", `{"lease":"a/b","leader":true}`, false},
		{"PUT", protocol.LeasePathPrefix, "", `{}`, false},
		{"DELETE", protocol.LeasePathPrefix + "work", "", ``, false},
		{"GET", "/handoff/v1/../v1/drain", "", "", false},
		{"POST", "/", "", "", false},
	} {
		f.Add(s.method, s.path, s.query, []byte(s.body), s.lead)
	}
	f.Fuzz(func(t *testing.T, method, path, query string, body []byte, lead bool) {
		a := newAgent(t, worker.Options{ReturnClaims: func(context.Context) (int, error) { return 2, nil }})
		h := a.Handler()
		if lead {
			w := httptest.NewRecorder()
			const grant = `{"lease":"work","leader":true,"fencingToken":7,"validForMillis":60000,"sequence":1}`
			r := sign(httptest.NewRequest(http.MethodPut, protocol.LeasePathPrefix+"work", strings.NewReader(grant)), grant)
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				t.Fatalf("granting leadership: %d %s", w.Code, w.Body.Bytes())
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := http.NewRequestWithContext(ctx, method, "http://127.0.0.1:7452"+path+"?"+query, bytes.NewReader(body))
		if err != nil || r.URL.Path != path || r.URL.RawQuery != query {
			return // not a request a client can send to this path
		}
		sign(r, string(body))
		r.RequestURI = r.URL.RequestURI() // as a server sees it: the handler is called directly
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)

		var want any // the route's answer type
		valid := true
		switch {
		case method == http.MethodPost && path == protocol.StopClaimingPath:
			want = &protocol.DrainStatus{}
		case (method == http.MethodGet || method == http.MethodHead) && path == protocol.DrainPath: // the mux serves HEAD as GET
			want = &protocol.DrainStatus{}
		case method == http.MethodPost && path == protocol.ReturnPath:
			want = &protocol.ReturnResult{}
			valid = decodes(body, &protocol.ReturnRequest{})
		case method == http.MethodPut && strings.HasPrefix(path, protocol.LeasePathPrefix) && len(path) > len(protocol.LeasePathPrefix) &&
			!strings.Contains(path[len(protocol.LeasePathPrefix):], "/"):
			want = &protocol.LeadershipAck{}
			var l protocol.Leadership
			valid = decodes(body, &l) && (l.Lease == "" || l.Lease == path[len(protocol.LeasePathPrefix):])
		default:
			if w.Code/100 == 2 {
				t.Fatalf("%s %s: %d for no protocol route", method, path, w.Code)
			}
			return
		}
		if ct := w.Header().Get("Content-Type"); w.Code/100 != 3 && ct != "application/json" {
			t.Fatalf("%s %s: %d with Content-Type %q: %s", method, path, w.Code, ct, w.Body.Bytes())
		}
		switch w.Code / 100 {
		case 2:
			if !valid {
				t.Fatalf("%s %s %q: %d for a body that is not the route's request: %s", method, path, body, w.Code, w.Body.Bytes())
			}
			if !decodes(w.Body.Bytes(), want) {
				t.Fatalf("%s %s: answer %s is not a %T", method, path, w.Body.Bytes(), want)
			}
		case 4, 5:
			var e struct{ Error string }
			if !decodes(w.Body.Bytes(), &e) || e.Error == "" {
				t.Fatalf("%s %s: %d without an error message: %s", method, path, w.Code, w.Body.Bytes())
			}
		}
	})
}

// decodes reports whether the first JSON value in b decodes into v, as the
// handler's json.Decoder reads a body.
func decodes(b []byte, v any) bool {
	return json.NewDecoder(bytes.NewReader(b)).Decode(v) == nil
}
