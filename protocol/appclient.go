package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"syscall"
	"time"
)

// AppClient calls the app's side of the protocol, as the sidecar does: on
// its socket or on loopback, every call bounded by its context and signed
// (Sign). The sidecar uses it; tests of an app (package worker's, the
// conformance suite's) call the app with it as the sidecar would.
type AppClient struct {
	base  string
	token string
	http  *http.Client
	now   func() time.Time
}

// NewAppClient returns a client for the app API at app (a socket, or a
// loopback address: ParseEndpoint) that signs every call with
// token, the pod's token (Sign), and follows no redirect: a call
// goes to the app's address only. Idle connections are kept 30 s, under the
// Go worker's 90 s, so the client closes them first. A call the app
// refuses as signed before it started (ErrBeforeStart: it was in flight
// across the app's restart) is sent once more, signed anew.
func NewAppClient(app Endpoint, token string) *AppClient {
	return &AppClient{base: app.URL(), token: token, now: time.Now, http: &http.Client{
		Transport:     app.Transport(4, 30*time.Second),
		CheckRedirect: NoRedirects,
	}}
}

// IsAppGone reports whether err means the app process has exited (or not
// started), so it holds no work: a refused connection, or a connection that
// ended (reset, EOF) followed by a refused or ended retry on a fresh one.
func IsAppGone(err error) bool {
	var gone *GoneError
	return errors.As(err, &gone) || errors.Is(err, syscall.ECONNREFUSED)
}

// GoneError is a call whose connection ended without an answer, and whose
// retry on a fresh connection was refused or ended too: the app has exited,
// however its connections were closed.
type GoneError struct {
	First, Retry error
}

func (e *GoneError) Error() string {
	return fmt.Sprintf("the app is gone: %v; retried on a fresh connection: %v", e.First, e.Retry)
}

// Unwrap gives both errors.
func (e *GoneError) Unwrap() []error { return []error{e.First, e.Retry} }

// refusedBeforeStart reports whether an answer of status code and body data is a 401
// refusal of a call signed before the receiver started (ErrBeforeStart):
// its error names the reason in the same words in every SDK.
func refusedBeforeStart(code int, data []byte) bool {
	return code == http.StatusUnauthorized && bytes.Contains(data, []byte(ErrBeforeStart.Error()))
}

// connectionEnded reports whether err is a transport error that ended the
// connection without an answer: refused, reset, broken pipe, or EOF.
func connectionEnded(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// StopClaiming tells the app to stop claiming new work.
func (a *AppClient) StopClaiming(ctx context.Context) (DrainStatus, error) {
	var st DrainStatus
	err := a.do(ctx, http.MethodPost, StopClaimingPath, struct{}{}, &st)
	return st, err
}

// Drain waits up to wait for the app to be drained and returns its status.
func (a *AppClient) Drain(ctx context.Context, wait time.Duration) (DrainStatus, error) {
	var st DrainStatus
	err := a.do(ctx, http.MethodGet, DrainPath+"?waitMillis="+strconv.FormatInt(wait.Milliseconds(), 10), nil, &st)
	return st, err
}

// Return asks the app to hand back its unfinished claims, canceling
// in-flight work first, and waiting up to cancelWait for it, when cancel is
// set.
func (a *AppClient) Return(ctx context.Context, cancel bool, cancelWait time.Duration) (ReturnResult, error) {
	var res ReturnResult
	req := ReturnRequest{Cancel: cancel, CancelWaitMillis: cancelWait.Milliseconds()}
	err := a.do(ctx, http.MethodPost, ReturnPath, req, &res)
	return res, err
}

// ErrUnauthorized is wrapped by the error of a call the app answered 401:
// it refused the sidecar's signature, so the sidecar and the worker do not
// read the same token file (HANDOFF_TOKEN_FILE), their clocks differ by
// more than 30 s, or the app is not the pod's.
var ErrUnauthorized = errors.New("the app refused the sidecar's signed call (401): the sidecar and the worker must read the same token file (" + TokenFileEnv + ")")

// ErrStale is returned by SetLeadership when the app ignored the message
// because it had applied one with a higher sequence.
var ErrStale = errors.New("the app ignored a stale leadership message")

// SetLeadership tells the app about one Lease; with l.Leader false it
// returns once the app's leader work for it has stopped. It returns
// ErrStale if the app did not apply the message.
func (a *AppClient) SetLeadership(ctx context.Context, l Leadership) error {
	var ack LeadershipAck
	if err := a.do(ctx, http.MethodPut, LeasePathPrefix+l.Lease, l, &ack); err != nil {
		return err
	}
	if ack.Stale {
		return ErrStale
	}
	return nil
}

func (a *AppClient) do(ctx context.Context, method, path string, in, out any) error {
	var encoded []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		encoded = b
	}
	send := func() (*http.Response, error) {
		var body io.Reader
		if in != nil {
			body = bytes.NewReader(encoded)
		}
		req, err := http.NewRequestWithContext(ctx, method, a.base+path, body)
		if err != nil {
			return nil, err
		}
		if in != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		Sign(req, a.token, encoded, a.now()) // a new nonce for each send
		return a.http.Do(req)
	}
	// exchange sends the call and returns the answer's status and body.
	exchange := func() (int, []byte, error) {
		resp, err := send()
		if err != nil && ctx.Err() == nil && connectionEnded(err) && !errors.Is(err, syscall.ECONNREFUSED) {
			// The connection ended without an answer: an app that exits at
			// once resets it. Once more on a fresh connection tells an app
			// that is gone from one that is not.
			a.http.CloseIdleConnections()
			first := err
			resp, err = send()
			if err != nil && ctx.Err() == nil && connectionEnded(err) {
				return 0, nil, &GoneError{First: first, Retry: err}
			}
		}
		if err != nil {
			return 0, nil, err
		}
		defer func() { _ = resp.Body.Close() }()
		data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, data, err
	}
	code, data, err := exchange()
	if err == nil && refusedBeforeStart(code, data) {
		// The app started after this call was signed: the call was in
		// flight across the app's restart (net/http resends a GET
		// whose reused connection had closed). The app ran nothing; the
		// same call, signed anew, is one made to it.
		code, data, err = exchange()
	}
	if err != nil {
		return err
	}
	if code == http.StatusUnauthorized {
		return fmt.Errorf("%s %s: %w: %s", method, path, ErrUnauthorized, bytes.TrimSpace(data))
	}
	if code/100 != 2 {
		return fmt.Errorf("%s %s: %d %s: %s", method, path, code, http.StatusText(code), bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decoding answer: %w", method, path, err)
	}
	return nil
}
