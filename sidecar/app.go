package sidecar

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

	"github.com/handoff-dev/handoff/protocol"
)

// AppClient calls the app's side of the protocol on loopback. Every call is
// bounded by its context.
type AppClient struct {
	base string
	http *http.Client
}

// NewAppClient returns a client for the app API at base, e.g.
// "http://127.0.0.1:7452".
func NewAppClient(base string) *AppClient {
	return &AppClient{base: base, http: &http.Client{Transport: &http.Transport{
		Proxy:               nil, // loopback: never through a proxy
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}}}
}

// IsAppGone reports whether err means nothing listens on the app's address:
// the app process has exited (or not started), so it holds no work.
func IsAppGone(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// StopClaiming tells the app to stop claiming new work.
func (a *AppClient) StopClaiming(ctx context.Context) (protocol.DrainStatus, error) {
	var st protocol.DrainStatus
	err := a.do(ctx, http.MethodPost, protocol.StopClaimingPath, struct{}{}, &st)
	return st, err
}

// Drain waits up to wait for the app to be drained and returns its status.
func (a *AppClient) Drain(ctx context.Context, wait time.Duration) (protocol.DrainStatus, error) {
	var st protocol.DrainStatus
	err := a.do(ctx, http.MethodGet, protocol.DrainPath+"?waitMillis="+strconv.FormatInt(wait.Milliseconds(), 10), nil, &st)
	return st, err
}

// Return asks the app to hand back its unfinished claims, canceling
// in-flight work first, and waiting up to cancelWait for it, when cancel is
// set.
func (a *AppClient) Return(ctx context.Context, cancel bool, cancelWait time.Duration) (protocol.ReturnResult, error) {
	var res protocol.ReturnResult
	req := protocol.ReturnRequest{Cancel: cancel, CancelWaitMillis: cancelWait.Milliseconds()}
	err := a.do(ctx, http.MethodPost, protocol.ReturnPath, req, &res)
	return res, err
}

// ErrStale is returned by SetLeadership when the app ignored the message
// because it had applied one with a higher sequence.
var ErrStale = errors.New("the app ignored a stale leadership message")

// SetLeadership tells the app about one Lease; with l.Leader false it
// returns once the app's leader work for it has stopped. It returns
// ErrStale if the app did not apply the message.
func (a *AppClient) SetLeadership(ctx context.Context, l protocol.Leadership) error {
	var ack protocol.LeadershipAck
	if err := a.do(ctx, http.MethodPut, protocol.LeasePathPrefix+l.Lease, l, &ack); err != nil {
		return err
	}
	if ack.Stale {
		return ErrStale
	}
	return nil
}

func (a *AppClient) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decoding answer: %w", method, path, err)
	}
	return nil
}
