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
// token (401).
var ErrUnauthorized = errors.New("the handoff sidecar refused the token (401)")

// ErrUnreachable is returned by Call when no sidecar answers at the address
// within the connect timeout.
var ErrUnreachable = errors.New("handoff sidecar not reachable")

// Call asks the sidecar at addr (a loopback host:port) to run the shutdown
// sequence and waits, until ctx ends, for its Report. token is the pod's
// token, sent as "Authorization: Bearer <token>"; a 401 answer is an error
// wrapping ErrUnauthorized. Connection refusals are retried every 100 ms for
// up to connectTimeout (a sidecar that is still starting); after that Call
// returns an error wrapping ErrUnreachable.
func Call(ctx context.Context, addr, token string, connectTimeout time.Duration) (*protocol.Report, error) {
	url := "http://" + addr + protocol.PreStopPath
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	giveUp := time.Now().Add(connectTimeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
		if err != nil {
			return nil, err
		}
		protocol.SetToken(req.Header, token)
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() != nil || !errors.Is(err, syscall.ECONNREFUSED) {
				return nil, fmt.Errorf("handoff sidecar at %s: %w", addr, errors.Join(ctx.Err(), err))
			}
			if !time.Now().Before(giveUp) {
				return nil, fmt.Errorf("%w at %s: %w (is the handoff sidecar running in this pod?)", ErrUnreachable, addr, err)
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
			return nil, fmt.Errorf("handoff sidecar at %s: reading answer: %w", addr, err)
		}
		if resp.StatusCode == http.StatusUnauthorized {
			return nil, fmt.Errorf("%w at %s: %s (does %s name this pod's token file?)", ErrUnauthorized, addr, bytes.TrimSpace(body), protocol.TokenFileEnv)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("handoff sidecar at %s: %s: %s", addr, resp.Status, body)
		}
		var rep protocol.Report
		if err := json.Unmarshal(body, &rep); err != nil {
			return nil, fmt.Errorf("handoff sidecar at %s: decoding report: %w", addr, err)
		}
		return &rep, nil
	}
}
