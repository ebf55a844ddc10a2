package main

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/internal/cli/clitest"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/protocol"
)

// A signed POST /v1/prestop read off lo and sent again after the sidecar
// restarted is refused 401 (signed before this receiver started): the new
// process cannot remember the nonces the old one accepted, and within the
// 30 s skew only the start bounds the call. Before, the replay got 200 and
// started the shutdown of a running pod. The real sidecar binary, its
// control API on loopback TCP (the opt-in transport a capture on lo reads).
func TestSidecarRefusesAPreStopReplayedAfterARestart(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	pod := env.Pod(t, ns, "worker-0", 30)
	tokenPath := clitest.TokenFile(t)
	token, err := protocol.ReadTokenFile(tokenPath)
	if err != nil {
		t.Fatal(err)
	}
	control, metrics := freeLoopbackAddr(t), freeLoopbackAddr(t)
	sidecar := func() (stop func()) {
		cmd, exited := runMain(t, "sidecar", "HANDOFF_TOKEN_FILE="+tokenPath,
			"HANDOFF_POD_NAME=worker-0", "HANDOFF_POD_NAMESPACE="+ns, "HANDOFF_POD_UID="+string(pod.UID),
			"HANDOFF_LEASES=work", "HANDOFF_KUBECONFIG="+env.Kubeconfig,
			"HANDOFF_CONTROL_ADDR="+control, "HANDOFF_METRICS_ADDR="+metrics,
			"HANDOFF_APP_URL=http://127.0.0.1:1", // no app: nothing to drain
			"HANDOFF_LEASE_DURATION=3s", "HANDOFF_RENEW_DEADLINE=2s", "HANDOFF_RETRY_PERIOD=250ms")
		kubetest.WaitFor(t, 20*time.Second, "the sidecar to answer /healthz", func() bool { return clitest.Probe(metrics) == nil })
		return func() { terminate(t, cmd, exited, "sidecar") }
	}
	// send writes raw, one HTTP/1.1 request's bytes, on a new connection
	// to the control API and returns the answer's status and body.
	send := func(raw []byte) (int, string) {
		t.Helper()
		conn, err := net.DialTimeout("tcp", control, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := conn.Write(raw); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(bytes.TrimSpace(body))
	}
	// wire signs a call as the hook does (prestop.Call) and returns the
	// bytes it puts on the wire.
	wire := func(method, path string) []byte {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+control+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Close = true
		protocol.Sign(req, token, nil, time.Now())
		var b bytes.Buffer
		if err := req.Write(&b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}

	stop := sidecar()
	captured := wire(http.MethodPost, protocol.PreStopPath)
	if code, body := send(captured); code != http.StatusOK {
		t.Fatalf("the signed preStop call: %d %s, want 200", code, body)
	}
	stop() // the pod stays: a restart of the sidecar container alone
	stop = sidecar()
	defer stop()
	code, body := send(captured)
	if code != http.StatusUnauthorized || !strings.Contains(body, protocol.ErrBeforeStart.Error()) {
		t.Fatalf("the same bytes after the restart: %d %s; want 401 naming %q", code, body, protocol.ErrBeforeStart)
	}
	// The refusal is not the new process refusing every call: one signed
	// now is answered.
	if code, body := send(wire(http.MethodGet, protocol.StatusPath)); code != http.StatusOK {
		t.Fatalf("a call signed after the restart: %d %s, want 200", code, body)
	}
}
