package prestop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// ErrUnauthorized is wrapped by Call's error when the sidecar refused the
// signed call (401).
var ErrUnauthorized = errors.New("the handoff sidecar refused the signed call (401)")

// ErrUnreachable is returned by Call when no sidecar answers at the address
// within the connect timeout.
var ErrUnreachable = errors.New("handoff sidecar not reachable")

// Call asks the sidecar at control (its socket, or a loopback address) to
// run the shutdown sequence and waits, until ctx ends, for its Report. The
// call is signed with token, the pod's token (protocol.Sign); a 401 answer
// is an error wrapping ErrUnauthorized. A refused connection, or a socket
// not made yet, is retried every 100 ms, signed anew, for up to
// connectTimeout (a sidecar that is still starting); after that Call
// returns an error wrapping ErrUnreachable. No redirect is followed.
func Call(ctx context.Context, control protocol.Endpoint, token string, connectTimeout time.Duration) (*protocol.Report, error) {
	url := control.URL() + protocol.PreStopPath
	client := &http.Client{Transport: control.Transport(0, 0), CheckRedirect: protocol.NoRedirects}
	defer client.CloseIdleConnections()
	giveUp := time.Now().Add(connectTimeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
		if err != nil {
			return nil, err
		}
		protocol.Sign(req, token, nil, time.Now())
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() != nil || !errors.Is(err, syscall.ECONNREFUSED) {
				return nil, fmt.Errorf("handoff sidecar at %s: %w", control, errors.Join(ctx.Err(), err))
			}
			if !time.Now().Before(giveUp) {
				return nil, fmt.Errorf("%w at %s: %w (is the handoff sidecar running in this pod?)", ErrUnreachable, control, err)
			}
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
			continue
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return nil, fmt.Errorf("handoff sidecar at %s: reading answer: %w", control, err)
		}
		if resp.StatusCode == http.StatusUnauthorized {
			return nil, fmt.Errorf("%w at %s: %s (does %s name this pod's token file?)", ErrUnauthorized, control, bytes.TrimSpace(body), protocol.TokenFileEnv)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("handoff sidecar at %s: %s: %s", control, resp.Status, body)
		}
		var rep protocol.Report
		if err := json.Unmarshal(body, &rep); err != nil {
			return nil, fmt.Errorf("handoff sidecar at %s: decoding report: %w", control, err)
		}
		return &rep, nil
	}
}

// GetStatus asks the sidecar at control for its status (GET
// protocol.StatusPath), signed with token, the pod's token. A refused
// connection or a socket not made yet is an error wrapping
// syscall.ECONNREFUSED (a sidecar still starting); a 401 answer one
// wrapping ErrUnauthorized. ctx bounds the call.
func GetStatus(ctx context.Context, control protocol.Endpoint, token string) (*protocol.Status, error) {
	client := &http.Client{Transport: control.Transport(0, 0), CheckRedirect: protocol.NoRedirects}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, control.URL()+protocol.StatusPath, nil)
	if err != nil {
		return nil, err
	}
	protocol.Sign(req, token, nil, time.Now())
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("handoff sidecar at %s: %w", control, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("handoff sidecar at %s: reading status: %w", control, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		return nil, fmt.Errorf("%w at %s: %s", ErrUnauthorized, control, bytes.TrimSpace(body))
	default:
		return nil, fmt.Errorf("handoff sidecar at %s: %s: %s", control, resp.Status, bytes.TrimSpace(body))
	}
	var st protocol.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("handoff sidecar at %s: decoding status: %w", control, err)
	}
	return &st, nil
}
