package sidecar

import (
	"context"
	"net/http"
	"time"

	"github.com/go-logr/logr"

	"github.com/handoff-dev/handoff/internal/cli/serve"
	"github.com/handoff-dev/handoff/internal/connlimit"
	"github.com/handoff-dev/handoff/protocol"
)

// probeConnBudget is the most the probe port's connections may cost idle:
// 9 MiB, 7% of the injected 128 MiB limit, over a sidecar of 28 MiB
// resident (docs/performance.md). It makes ProbeTimeouts' total 512.
const probeConnBudget = 9 << 20

var (
	// ProbeTimeouts are the probe and metrics port's bounds: the kubelet's probes and metrics scrapes send no body
	// and get a small answer; the write limit leaves time to gather the
	// metrics, the idle one keeps a scraper's connection between scrapes
	// 15s apart.
	// Connections: the port listens on every interface (metrics-addr
	// :7451), for the kubelet (a new connection per probe, from the node's
	// address: 2 probes every 5 and 10 s on the injected sidecar, each done
	// within its 1 s timeout) and a scraper (one kept-alive connection per
	// scrape job). 16 from one address is several times what they hold.
	// The total is what probeConnBudget pays for: 512 (9 MiB idle, about
	// 17 MiB all sending the largest header). Past either cap, a new
	// connection takes the place of one that is idle or has waited more
	// than a second for its request (connlimit): a flood that holds its
	// slots open and quiet, from one address or many, the node's own
	// among them, does not keep the kubelet's probes out.
	ProbeTimeouts = serve.Timeouts{ReadHeader: 5 * time.Second, Read: 5 * time.Second, Write: 10 * time.Second, Idle: 30 * time.Second,
		Conns: connlimit.Limits{Total: probeConnBudget / serve.IdleConnBytes, PerAddr: 16}}
	// controlTimeouts: the same for GET /v1/status and every refused call.
	// POST /v1/prestop, once authorized and its (empty) body read, clears
	// its connection's read and write deadlines (prestop.Handler): its
	// answer waits for the whole sequence, which its own deadline bounds,
	// and a read deadline passing meanwhile would cancel it.
	// The hook calls once: an idle connection is not kept long.
	// Connections: its clients are the hook and status readers in the pod,
	// a handful at once; 64 cost at most 1.2 MiB idle. Over TCP they all come from
	// loopback, one address for every container of the pod, so the
	// per-address cap is the total: it cannot tell the hook from a
	// neighbour container (a Unix socket in a volume only the injected
	// containers mount can).
	controlTimeouts = serve.Timeouts{ReadHeader: 5 * time.Second, Read: 5 * time.Second, Write: 10 * time.Second, Idle: 5 * time.Second,
		Conns: connlimit.Limits{Total: 64, PerAddr: 64}}
)

// listenControl makes the control API's socket (protocol.Endpoint.Listen:
// a stale one replaced, anything else at its path refused), or binds its
// TCP address where the pod opted into one, before returning.
func listenControl(e protocol.Endpoint, h http.Handler, log logr.Logger, t serve.Timeouts) (*http.Server, error) {
	if e.Network == "tcp" {
		return serve.Listen(e.Address, h, log, t)
	}
	ln, err := e.Listen(context.Background())
	if err != nil {
		return nil, err
	}
	return serve.Serve(ln, h, log, t), nil
}
