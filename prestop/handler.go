package prestop

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// Sequence is the shutdown sequence the handler starts or joins.
type Sequence interface {
	// Shutdown starts the sequence, or joins the one under way, and returns
	// its report once it is over, or ctx's error if ctx ends first (the
	// sequence goes on).
	Shutdown(ctx context.Context, trigger protocol.Trigger) (*protocol.Report, error)
}

// maxBody is the most of a request body Handler reads: the call has none.
const maxBody = 1 << 10

// TriggerPreStop names the preStop hook as the trigger of a sequence.
const TriggerPreStop = protocol.TriggerPreStop

// Handler serves POST protocol.PreStopPath: it runs seq and answers 200 with
// the JSON Report when the sequence is over, or 503 if the caller went away
// first. A call that v does not verify (unsigned, signed with another
// token, altered, stale, replayed: protocol.Verifier) is answered 401 with
// {"error": "..."} and starts nothing; a nil v verifies nothing (tests
// only).
func Handler(seq Sequence, v *protocol.Verifier) http.Handler {
	return protocol.Signed(v, maxBody, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "use POST", http.StatusMethodNotAllowed)
			return
		}
		// The call's body (none) was read under the server's read
		// deadline. Now the connection's deadlines are cleared: the answer
		// waits for the whole sequence (bounded by its own deadline), and a
		// read deadline passing meanwhile would end the server's wait for
		// the hook to go away, and cancel the call.
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Time{}) // unsupported only off net/http's server: no deadline to clear
		_ = rc.SetWriteDeadline(time.Time{})
		rep, err := seq.Shutdown(r.Context(), TriggerPreStop)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rep)
	}))
}
