// Package serve runs the HTTP servers of handoff's commands (the sidecar's
// probe and control ports, the webhook's health port) within bounds: the
// timeouts, the header size and the connection caps each is given.
package serve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"

	"github.com/handoff-dev/handoff/internal/connlimit"
)

// Timeouts are the limits of one server's connections. The timeouts
// (net/http's http.Server fields of the same names): a client that sends
// its request, or reads the answer, slower than that, or keeps an idle
// connection longer, is cut off, so no client holds a connection for long.
// Conns: how many it may hold at once (internal/connlimit).
type Timeouts struct {
	ReadHeader, Read, Write, Idle time.Duration
	Conns                         connlimit.Limits
}

// MaxHeaderBytes bounds a request's header on every server (8 KiB,
// and the 4 KiB net/http reads past it; its default is 1 MiB, read into
// memory): the kubelet's probes, a scrape and the hook's calls send well
// under 1 KiB. A larger header is answered 431. A connection sending the largest header holds about twice
// it (the bytes read and their parse) over its idle cost (IdleConnBytes)
// while the header is read: at most the read-header timeout.
const MaxHeaderBytes = 8 << 10

// IdleConnBytes is what one idle connection (connected, nothing sent)
// costs the sidecar, measured by BenchmarkIdleConnectionMemory on the
// probe server (2026-12-03, amd64, go1.27.3; a fresh process, 4,000
// connections): 4.1 KiB of goroutine stack and 10.2 KiB of heap (net/http's
// conn, its 4 KiB read and write buffers), of which 7.8 KiB is resident
// while idle, plus about 3.7 KiB of kernel memory for the socket (slab
// objects TCP, sock_inode_cache, filp, dentry, eventpoll_epi; charged to
// the container's memory cgroup, not in RSS). 16,000 of them, the issue's
// flood, are 280 MiB: over any limit the sidecar is given. The caps are
// sized from it.
const IdleConnBytes = 18 << 10

// Listen binds addr before returning, so a busy port is an error at start,
// and serves h there within t: its timeouts, MaxHeaderBytes, and its
// connection caps (connlimit.Listen: past t.Conns.Total open, or
// t.Conns.PerAddr from one address, a new connection takes the place of
// an idle or long-waiting one, else is reset at once).
func Listen(addr string, h http.Handler, log logr.Logger, t Timeouts) (*http.Server, error) {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	return Serve(ln, h, log, t), nil
}

// Serve serves h on ln within t until the server is shut down: its
// timeouts, MaxHeaderBytes and its connection caps (connlimit.Listen; a
// socket's connections count against the total only).
func Serve(ln net.Listener, h http.Handler, log logr.Logger, t Timeouts) *http.Server {
	limited := connlimit.Listen(ln, t.Conns)
	srv := &http.Server{Addr: ln.Addr().String(), Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, WriteTimeout: t.Write, IdleTimeout: t.Idle,
		MaxHeaderBytes: MaxHeaderBytes, ConnState: limited.ConnState}
	go func() {
		if err := srv.Serve(limited); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "serving stopped", "addr", srv.Addr)
		}
	}()
	return srv
}
