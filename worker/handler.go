package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/netutil"

	"github.com/handoff-dev/handoff/protocol"
)

// Timeouts of the server ListenAndServe runs.
const (
	serverReadTimeout  = 5 * time.Second
	serverWriteTimeout = 10 * time.Second
	serverIdleTimeout  = 90 * time.Second
)

// maxHeaderBytes bounds a request's header: the sidecar's are under 1 KiB.
const maxHeaderBytes = 8 << 10

// maxConns bounds the connections ListenAndServe's server holds at once;
// past it, new ones wait in the kernel's accept queue. The sidecar keeps 4
// idle and opens a few more in a sequence; at about 18 KiB each, with a
// 64 KiB body being read, 64 cost at most 5 MiB. On a socket (or loopback)
// every client has one address, so there is no per-address cap to set.
const maxConns = 64

// maxDrainWait bounds one long poll of the drain status.
const maxDrainWait = 30 * time.Second

// MaxBodyBytes bounds a request body of the app API. A larger body is
// answered 413 Request Entity Too Large. The sidecar's bodies are under
// 1 KiB.
const MaxBodyBytes = 64 << 10

// Handler serves the app side of the protocol under protocol.AppPrefix
// ("/handoff/v1/"). Serve it on the socket the injector names
// (ListenAndServe), or on loopback. Every call must be signed with the pod's
// token (Options.Token; protocol.Sign): one unsigned, signed with another
// token, altered, more than 30 s off this process's clock, or sent again,
// is answered 401 with a JSON error and not acted on (unless the Agent was
// made with InsecureNoToken and no token). A call's body (at most
// MaxBodyBytes; a larger one is answered 413) is read at once, under the
// server's read timeout if it has one, and checked with its signature; then
// the connection's read and write deadlines are cleared, so that a drain
// long poll or a revoke may wait longer than the server's timeouts. A
// leadership message that cannot come from the sidecar (a sequence more
// than protocol.MaxSequenceAhead ahead of the Agent's clock, a grant valid
// for longer than the lease duration) is answered 422 and not applied.
func (a *Agent) Handler() http.Handler {
	mux := a.mux()
	return protocol.Signed(a.verifier, MaxBodyBytes, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The body was read whole under the server's read deadline (a drain
		// long poll or a revoke waits longer than a server's read timeout,
		// and a read deadline passing meanwhile would cancel the call:
		// net/http's wait for the client to go away fails with it).
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Time{}) // unsupported off net/http's server: no deadline to clear
		_ = rc.SetWriteDeadline(time.Time{})
		mux.ServeHTTP(w, r)
	}))
}

func (a *Agent) mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.StopClaimingPath, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, a.stopClaiming())
	})
	mux.HandleFunc("GET "+protocol.DrainPath, func(w http.ResponseWriter, r *http.Request) {
		wait, err := waitParam(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		a.waitClaims(ctx) // not drained: the status says so
		writeJSON(w, http.StatusOK, a.drainStatus())
	})
	mux.HandleFunc("POST "+protocol.ReturnPath, func(w http.ResponseWriter, r *http.Request) {
		var req protocol.ReturnRequest
		if code, err := decodeBody(w, r, &req); err != nil {
			writeError(w, code, err)
			return
		}
		if req.CancelWaitMillis < 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("body: cancelWaitMillis %d; want a whole number of milliseconds, 0 or more", req.CancelWaitMillis))
			return
		}
		n, err := a.Return(r.Context(), req.Cancel, millis(req.CancelWaitMillis))
		res := protocol.ReturnResult{Returned: n}
		if err != nil {
			res.Error = err.Error()
		}
		writeJSON(w, http.StatusOK, res)
	})
	mux.HandleFunc("PUT "+protocol.LeasePathPrefix+"{lease}", func(w http.ResponseWriter, r *http.Request) {
		received := a.clock.Now()
		var l protocol.Leadership
		if code, err := decodeBody(w, r, &l); err != nil {
			writeError(w, code, err)
			return
		}
		lease := r.PathValue("lease")
		if l.Lease != "" && l.Lease != lease {
			writeError(w, http.StatusBadRequest, fmt.Errorf("body: lease %q differs from the path's Lease %q; want the same name, or leave it out", l.Lease, lease))
			return
		}
		if err := a.genuine(l, received); err != nil {
			writeError(w, http.StatusUnprocessableEntity, err)
			return
		}
		var grant *Leadership
		if l.Leader {
			until := received.Add(millis(l.ValidForMillis))
			if !l.Until.IsZero() && l.Until.Before(until) {
				until = l.Until
			}
			grant = &Leadership{Lease: lease, FencingToken: l.FencingToken, Until: until}
		}
		// The sequence is checked and the term changed at once: of two
		// messages handled together, the earlier is stale either way.
		stale, ended := a.applyLeadership(lease, l.Sequence, grant)
		switch {
		case stale:
			writeJSON(w, http.StatusOK, protocol.LeadershipAck{Leader: l.Leader, Stale: true})
		case l.Leader:
			writeJSON(w, http.StatusOK, protocol.LeadershipAck{Leader: true})
		default:
			if err := a.waitLeaderWork(r.Context(), lease, ended); err != nil {
				writeError(w, http.StatusServiceUnavailable, fmt.Errorf("leader work did not stop: %w", err))
				return
			}
			writeJSON(w, http.StatusOK, protocol.LeadershipAck{Leader: false})
		}
	})
	return mux
}

// genuine refuses a leadership message received at received that the
// sidecar cannot have sent: applied, a sequence far ahead would make every
// later genuine message stale (a revoke among them), and a grant longer
// than any term would keep this process leading after the Lease has moved.
func (a *Agent) genuine(l protocol.Leadership, received time.Time) error {
	now := received.UnixNano()
	if l.Sequence > now && l.Sequence-now > int64(protocol.MaxSequenceAhead) {
		return fmt.Errorf("body: sequence %d is %s ahead of this process's clock; want a sequence (the send time in Unix nanoseconds) at most %s ahead",
			l.Sequence, time.Duration(l.Sequence-now), protocol.MaxSequenceAhead)
	}
	if !l.Leader {
		return nil
	}
	if l.ValidForMillis > a.maxTerm.Milliseconds() {
		return fmt.Errorf("body: validForMillis %d is longer than the lease duration %s, which bounds every term the sidecar grants; want at most %d",
			l.ValidForMillis, a.maxTerm, a.maxTerm.Milliseconds())
	}
	if !l.Until.IsZero() && l.Until.Sub(received) > a.maxTerm {
		return fmt.Errorf("body: until %s is %s after receipt, longer than the lease duration %s, which bounds every term the sidecar grants; want an until at most %s ahead",
			l.Until.Format(time.RFC3339Nano), l.Until.Sub(received), a.maxTerm, a.maxTerm)
	}
	return nil
}

// ListenAndServe serves Handler on addr until ctx ends. addr is
// protocol.ParseEndpoint's form: the socket the injector names,
// "unix:///handoff-run/app.sock", or a loopback address a pod opted into,
// like "http://127.0.0.1:7452"; "" is the address in the environment
// variable HANDOFF_APP_URL (protocol.AppURLEnv), which the injector sets in
// the worker container. A socket is made as protocol.Endpoint.Listen makes
// it (a stale one replaced, anything else refused) and removed when the
// server stops. Its server holds at most 64 connections at once (more wait
// to be accepted), cuts off a client that takes more than 5 s to send its
// request (of at most 8 KiB of header) or 10 s to read an answer, except a
// signed call once its body is read (Handler), and closes idle connections
// after 90 s.
func (a *Agent) ListenAndServe(ctx context.Context, addr string) error {
	from := "address"
	if addr == "" {
		addr, from = os.Getenv(protocol.AppURLEnv), "environment variable "+protocol.AppURLEnv
		if addr == "" {
			return fmt.Errorf("handoff app address: none given and %s is not set (the handoff injector sets it to unix://%s)", protocol.AppURLEnv, protocol.AppSocket)
		}
	}
	e, err := protocol.ParseEndpoint(addr)
	if err != nil {
		return fmt.Errorf("handoff app %s: %w", from, err)
	}
	ln, err := e.Listen(ctx)
	if err != nil {
		return fmt.Errorf("handoff app %s %s: %w", from, addr, err)
	}
	srv := &http.Server{Handler: a.Handler(),
		// A client that sends its request (or reads the answer) slower is
		// cut off; a signed call, once its body is read, is exempt
		// (Handler). Idle connections outlive the sidecar's own (30 s), so
		// the sidecar closes them first and never sends on a closing one.
		ReadHeaderTimeout: serverReadTimeout, ReadTimeout: serverReadTimeout, WriteTimeout: serverWriteTimeout, IdleTimeout: serverIdleTimeout,
		MaxHeaderBytes: maxHeaderBytes}
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	defer stop()
	if err := srv.Serve(netutil.LimitListener(ln, maxConns)); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// decodeBody decodes the request body, one JSON value of at most
// MaxBodyBytes, into v. Unknown fields are ignored, so a newer sidecar may
// send fields this app does not know. It returns the status to answer with
// and the error: 413 for a body over the limit, 400 for one that is empty,
// not JSON of v's shape, or followed by anything but white space.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) (int, error) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var raw json.RawMessage
	err := dec.Decode(&raw)
	if err == nil && !bytes.HasPrefix(bytes.TrimLeft(raw, " \t\r\n"), []byte("{")) {
		// null, a number, a string or an array: not a message.
		return http.StatusBadRequest, fmt.Errorf("body: %.20s is not a JSON object; want one JSON object", raw)
	}
	if err == nil {
		err = json.Unmarshal(raw, v)
	}
	if err == nil {
		// Anything after the value, a second value included, is refused:
		// a body is one JSON object.
		if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
			err = errTrailing
			if tooLarge(terr) {
				err = terr
			}
		}
	}
	switch {
	case err == nil:
		return 0, nil
	case tooLarge(err):
		return http.StatusRequestEntityTooLarge, fmt.Errorf("body: larger than %d bytes; want at most %d bytes (64 KiB) of JSON", MaxBodyBytes, MaxBodyBytes)
	case errors.Is(err, io.EOF):
		return http.StatusBadRequest, errors.New("body: empty; want one JSON object")
	case errors.Is(err, errTrailing):
		return http.StatusBadRequest, errors.New("body: data after the JSON value; want one JSON object and nothing after it but white space")
	default:
		return http.StatusBadRequest, fmt.Errorf("body: %w; want one JSON object", err)
	}
}

var errTrailing = errors.New("trailing data")

func tooLarge(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}

// waitParam reads the drain long poll's waitMillis: absent or empty is 0
// (answer at once), above maxDrainWait (at any size) is maxDrainWait; not a
// whole number, negative, or given more than once is an error.
func waitParam(r *http.Request) (time.Duration, error) {
	vs := r.URL.Query()["waitMillis"]
	if len(vs) > 1 {
		return 0, fmt.Errorf("waitMillis given %d times; want it once", len(vs))
	}
	if len(vs) == 0 || strings.TrimSpace(vs[0]) == "" {
		return 0, nil
	}
	v := strings.TrimSpace(vs[0])
	ms, err := strconv.ParseInt(v, 10, 64)
	if errors.Is(err, strconv.ErrRange) && ms > 0 {
		return maxDrainWait, nil // beyond int64, and so beyond the bound
	}
	if err != nil || ms < 0 {
		return 0, fmt.Errorf("waitMillis %q: want a whole number of milliseconds, 0 or more", vs[0])
	}
	// Compare in milliseconds: ms * time.Millisecond overflows above about
	// 292 years.
	if ms >= maxDrainWait.Milliseconds() {
		return maxDrainWait, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// millis converts a wire duration in milliseconds, saturating instead of
// overflowing: beyond about 292 years it is the longest time.Duration, and
// a negative one is 0.
func millis(ms int64) time.Duration {
	switch {
	case ms <= 0:
		return 0
	case ms > math.MaxInt64/int64(time.Millisecond):
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// writeJSON answers v with code, in one write: the body is encoded first
// and sent with its Content-Length, so net/http writes the status line,
// headers and body to the connection together (see docs/protocol.md: an
// answer in two writes can wait ~40 ms for Nagle and delayed ACK).
func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		code, body = http.StatusInternalServerError, []byte(`{"error":"encoding the answer failed"}`)
	}
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// writeError answers {"error": err} with code.
func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, protocolError{Error: err.Error()})
}

// protocolError is the body of an error answer.
type protocolError struct {
	Error string `json:"error"`
}
