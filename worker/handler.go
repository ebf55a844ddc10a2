package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// maxDrainWait bounds one long poll of the drain status.
const maxDrainWait = 30 * time.Second

// Handler serves the app side of the protocol under protocol.AppPrefix
// ("/handoff/v1/"). Serve it on loopback only.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.StopClaimingPath, func(w http.ResponseWriter, _ *http.Request) {
		a.StopClaiming()
		writeJSON(w, http.StatusOK, a.drainStatus())
	})
	mux.HandleFunc("GET "+protocol.DrainPath, func(w http.ResponseWriter, r *http.Request) {
		wait, err := waitParam(r)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		a.WaitDrained(ctx)
		writeJSON(w, http.StatusOK, a.drainStatus())
	})
	mux.HandleFunc("POST "+protocol.ReturnPath, func(w http.ResponseWriter, r *http.Request) {
		var req protocol.ReturnRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body: " + err.Error()})
			return
		}
		n, err := a.Return(r.Context(), req.Cancel, time.Duration(req.CancelWaitMillis)*time.Millisecond)
		res := protocol.ReturnResult{Returned: n}
		if err != nil {
			res.Error = err.Error()
		}
		writeJSON(w, http.StatusOK, res)
	})
	mux.HandleFunc("PUT "+protocol.LeasePathPrefix+"{lease}", func(w http.ResponseWriter, r *http.Request) {
		received := time.Now()
		var l protocol.Leadership
		if err := json.NewDecoder(r.Body).Decode(&l); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body: " + err.Error()})
			return
		}
		lease := r.PathValue("lease")
		if l.Lease != "" && l.Lease != lease {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("body names Lease %q, path %q", l.Lease, lease)})
			return
		}
		if !a.sequenced(lease, l.Sequence) {
			writeJSON(w, http.StatusOK, protocol.LeadershipAck{Leader: l.Leader, Stale: true})
			return
		}
		if !l.Leader {
			if err := a.revoke(r.Context(), lease); err != nil {
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "leader work did not stop: " + err.Error()})
				return
			}
			writeJSON(w, http.StatusOK, protocol.LeadershipAck{Leader: false})
			return
		}
		until := received.Add(time.Duration(l.ValidForMillis) * time.Millisecond)
		if !l.Until.IsZero() && l.Until.Before(until) {
			until = l.Until
		}
		a.grant(Leadership{Lease: lease, FencingToken: l.FencingToken, Until: until})
		writeJSON(w, http.StatusOK, protocol.LeadershipAck{Leader: true})
	})
	return mux
}

// ListenAndServe serves Handler on addr until ctx ends. addr must be a
// loopback host:port, like "127.0.0.1:7452".
func (a *Agent) ListenAndServe(ctx context.Context, addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("handoff app address %q: want host:port", addr)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("handoff app address %q: want a loopback address, like 127.0.0.1:7452", addr)
	}
	srv := &http.Server{Addr: addr, Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	defer stop()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (a *Agent) drainStatus() protocol.DrainStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	stopping := false
	select {
	case <-a.stopping:
		stopping = true
	default:
	}
	return protocol.DrainStatus{Stopping: stopping, InFlight: a.inFlight, Drained: a.inFlight == 0}
}

func waitParam(r *http.Request) (time.Duration, error) {
	v := r.URL.Query().Get("waitMillis")
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || ms < 0 {
		return 0, fmt.Errorf("waitMillis %q: want a whole number of milliseconds, 0 or more", v)
	}
	return min(time.Duration(ms)*time.Millisecond, maxDrainWait), nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
