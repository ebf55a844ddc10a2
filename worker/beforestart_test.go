package worker_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

func stopping(a *worker.Agent) bool {
	select {
	case <-a.Stopping():
		return true
	default:
		return false
	}
}

// An Agent refuses a call signed before it was made (401, signed before
// this receiver started), within the 30 s skew and with a nonce it never
// saw: a call captured before the worker restarted and replayed after it.
// It stops claiming on none; a call signed now is answered.
func TestAgentRefusesACallSignedBeforeItStarted(t *testing.T) {
	signedBefore := time.Now().Add(-10 * time.Second)
	a := newAgent(t, worker.Options{})
	h := a.Handler()

	old := httptest.NewRequest(http.MethodPost, protocol.StopClaimingPath, strings.NewReader("{}"))
	protocol.Sign(old, testToken, []byte("{}"), signedBefore)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, old)
	if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), protocol.ErrBeforeStart.Error()) {
		t.Fatalf("a call signed before the Agent was made: %d %s; want 401 naming %q", w.Code, w.Body, protocol.ErrBeforeStart)
	}
	if stopping(a) {
		t.Fatal("the refused call stopped claiming")
	}

	now := sign(httptest.NewRequest(http.MethodPost, protocol.StopClaimingPath, strings.NewReader("{}")), "{}")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, now)
	if w.Code != http.StatusOK || !stopping(a) {
		t.Fatalf("a call signed now: %d %s, stopping %v; want 200 and claiming stopped", w.Code, w.Body, stopping(a))
	}
}
