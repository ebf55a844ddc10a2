package protocol_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// A call signed before the receiver started is refused, ErrBeforeStart,
// even within MaxClockSkew and with a nonce the receiver never saw: it is a
// call captured before a restart and replayed after it. A call signed in
// the millisecond the receiver started, or after, is accepted.
func TestVerifyRefusesACallSignedBeforeTheReceiverStarted(t *testing.T) {
	start := time.Date(2026, 12, 3, 10, 0, 0, 500_000_000, time.UTC)
	now := start
	v := protocol.NewVerifier(token, func() time.Time { return now })
	if got := v.Started(); !got.Equal(start) {
		t.Errorf("Started = %v, want %v", got, start)
	}
	now = start.Add(15 * time.Second) // a restart 15 s ago
	for _, tc := range []struct {
		name string
		at   time.Time
		want error
	}{
		{"15 s before the start (within the skew)", start.Add(-15 * time.Second), protocol.ErrBeforeStart},
		{"a millisecond before the start", start.Add(-time.Millisecond), protocol.ErrBeforeStart},
		{"a minute before the start (past the skew)", start.Add(-time.Minute), protocol.ErrClockSkew},
		{"in the start's millisecond", start.Add(999 * time.Microsecond), nil},
		{"at the start", start, nil},
		{"after the start", start.Add(time.Second), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := v.Verify(signed(t, "POST", "/v1/prestop", nil, token, tc.at), nil)
			if !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
			if err == nil {
				return
			}
			w := httptest.NewRecorder()
			protocol.Refuse(w, err)
			if w.Code != http.StatusUnauthorized || errors.Is(tc.want, protocol.ErrBeforeStart) && !strings.Contains(w.Body.String(), protocol.ErrBeforeStart.Error()) {
				t.Errorf("Refuse: %d %s; want 401 naming %q", w.Code, w.Body, protocol.ErrBeforeStart)
			}
		})
	}
}

// The AppClient sends a call the app refused as signed before it started
// once more, signed anew; it does not resend a call refused for another
// reason.
func TestAppClientResignsACallRefusedBeforeStart(t *testing.T) {
	for _, tc := range []struct {
		name      string
		refuse    error
		wantCalls int32
		wantErr   error
	}{
		{"before start", protocol.ErrBeforeStart, 2, nil},
		{"bad signature", protocol.ErrBadSignature, 1, protocol.ErrUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			nonces := make(chan string, 2)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				nonces <- r.Header.Get(protocol.NonceHeader)
				if calls.Add(1) == 1 {
					protocol.Refuse(w, fmt.Errorf("%w: test", tc.refuse))
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"stopping":true,"inFlight":0}`)
			}))
			defer srv.Close()
			ep, err := protocol.ParseEndpoint(srv.Listener.Addr().(*net.TCPAddr).String())
			if err != nil {
				t.Fatal(err)
			}
			_, err = protocol.NewAppClient(ep, token).StopClaiming(context.Background())
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("StopClaiming = %v, want %v", err, tc.wantErr)
			}
			if got := calls.Load(); got != tc.wantCalls {
				t.Fatalf("the app got %d calls, want %d", got, tc.wantCalls)
			}
			if tc.wantCalls == 2 {
				if a, b := <-nonces, <-nonces; a == b {
					t.Errorf("the second send reused nonce %s; want it signed anew", a)
				}
			}
		})
	}
}
