// Package connlimit bounds the connections a server holds open, so that a
// flood of connections costs it a bounded amount of memory, and makes room
// for a new client rather than let the first to come keep every slot.
//
// Listen wraps a listener with two caps: at most Total connections open at
// once, and at most PerAddr of them from any one remote IP address. A
// connection that would pass a cap takes the place of one already open
// that is doing nothing for its client:
//   - first the one that has been idle longest between two requests (a
//     kept-alive connection, http.StateIdle);
//   - else the one that has waited longest for its first request
//     (http.StateNew: connected, the TLS handshake or the request's header
//     not done), if it has waited more than Grace;
//   - a connection in the middle of a request (http.StateActive) or handed
//     off (http.StateHijacked) is never closed.
//
// The one it replaces is closed with a TCP reset (SO_LINGER 0: no
// TIME_WAIT kept); if none can be, the new connection is reset at once,
// before a byte is read or written, and Accept goes on to the next. So
// connections held open and quiet (a flood of idle or kept-alive
// connections from any number of addresses, a client sending its header a
// byte at a time) never keep out a client that sends its request when it
// connects: the kubelet's probes, a scraper, the API server's admission
// calls. A new connection is spared for Grace, long enough to send its
// request.
//
// The server must report each connection's state: set its http.Server's
// ConnState to Listener.ConnState (a TLS listener over this one is fine).
// Without it every connection counts as waiting for its first request since
// it was accepted.
//
// What it cannot tell apart: clients of one address (all the containers of
// a pod on loopback; a node process and the kubelet's probes, from the
// node's address), and a flood that opens new connections faster than
// Grace: each of them, young, is spared, so a new client may be reset
// until the flood stops. Connections with no IP address (Unix sockets)
// count against the total only.
package connlimit

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultGrace is Limits.Grace when it is zero.
const DefaultGrace = time.Second

// Limits are the caps of one listener.
type Limits struct {
	// Total is the most connections open at once, at least 1.
	Total int
	// PerAddr is the most open connections from one remote IP address, at
	// least 1; at most Total.
	PerAddr int
	// Grace is how long a new connection is spared, waiting for its first
	// request, before it may be closed to make room; 0: DefaultGrace.
	Grace time.Duration
}

// Listener is a listener with Limits (see the package doc). Closing it
// closes the wrapped listener; the connections it accepted stay open until
// closed.
type Listener struct {
	net.Listener
	perAddr, total int
	grace          time.Duration
	now            func() time.Time // time.Now; tests set it

	refused, evicted atomic.Uint64

	mu     sync.Mutex
	conns  map[*conn]struct{}
	byAddr map[netip.Addr]int // open connections by remote address; no zero entries
}

// Listen wraps ln with the limits l. It panics if l.Total or l.PerAddr is
// below 1 or l.Grace below 0: a listener that can never accept is a
// programming error.
func Listen(ln net.Listener, l Limits) *Listener {
	if l.Total < 1 || l.PerAddr < 1 || l.Grace < 0 {
		panic("connlimit: Total and PerAddr must be at least 1, Grace at least 0")
	}
	if l.Grace == 0 {
		l.Grace = DefaultGrace
	}
	return &Listener{Listener: ln, perAddr: min(l.PerAddr, l.Total), total: l.Total, grace: l.Grace, now: time.Now,
		conns: map[*conn]struct{}{}, byAddr: map[netip.Addr]int{}}
}

// Refused is how many new connections were reset at once, no open one
// being closable, since Listen.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Evicted is how many open connections were closed to make room for a new
// one, since Listen.
func (l *Listener) Evicted() uint64 { return l.evicted.Load() }

// Accept returns the next connection within the caps, closing the open
// connections it makes room from and resetting at once the new ones it
// cannot. Its errors are the wrapped listener's.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr, hasAddr := remoteIP(c)
		now := l.now()
		nc := &conn{Conn: c, l: l, addr: addr, hasAddr: hasAddr, state: http.StateNew, since: now}
		var victims []*conn
		ok := true
		l.mu.Lock()
		if hasAddr && l.byAddr[addr] >= l.perAddr {
			v := l.victimLocked(now, func(o *conn) bool { return o.hasAddr && o.addr == addr })
			if v == nil {
				ok = false
			} else {
				l.dropLocked(v)
				victims = append(victims, v)
			}
		}
		if ok && len(l.conns) >= l.total {
			v := l.victimLocked(now, func(*conn) bool { return true })
			if v == nil {
				ok = false
			} else {
				l.dropLocked(v)
				victims = append(victims, v)
			}
		}
		if ok {
			l.conns[nc] = struct{}{}
			if hasAddr {
				l.byAddr[addr]++
			}
		}
		l.mu.Unlock()
		for _, v := range victims {
			l.evicted.Add(1)
			reset(v.Conn)
		}
		if ok {
			return nc, nil
		}
		l.refused.Add(1)
		reset(c)
	}
}

// victimLocked is the open connection among those match accepts that may
// be closed to make room at now (the package doc's order), or nil.
func (l *Listener) victimLocked(now time.Time, match func(*conn) bool) *conn {
	var idle, waiting *conn
	for c := range l.conns {
		if !match(c) {
			continue
		}
		switch c.state {
		case http.StateIdle:
			if idle == nil || c.since.Before(idle.since) {
				idle = c
			}
		case http.StateNew:
			if now.Sub(c.since) > l.grace && (waiting == nil || c.since.Before(waiting.since)) {
				waiting = c
			}
		}
	}
	if idle != nil {
		return idle
	}
	return waiting
}

// dropLocked takes c out of the count, once.
func (l *Listener) dropLocked(c *conn) {
	if c.dropped {
		return
	}
	c.dropped = true
	delete(l.conns, c)
	if c.hasAddr {
		if l.byAddr[c.addr] <= 1 {
			delete(l.byAddr, c.addr)
		} else {
			l.byAddr[c.addr]--
		}
	}
}

// ConnState records the state of a connection this listener accepted (or
// of the TLS connection over one), for http.Server.ConnState. Other
// connections are ignored.
func (l *Listener) ConnState(c net.Conn, s http.ConnState) {
	for {
		if u, ok := c.(interface{ NetConn() net.Conn }); ok {
			c = u.NetConn()
			continue
		}
		break
	}
	ours, ok := c.(*conn)
	if !ok || ours.l != l {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ours.state != s {
		ours.state, ours.since = s, l.now()
	}
}

// remoteIP is c's remote IP address, IPv4-mapped addresses as IPv4; false
// for a connection with none (a Unix socket).
func remoteIP(c net.Conn) (netip.Addr, bool) {
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	ip, ok := netip.AddrFromSlice(a.IP)
	return ip.Unmap(), ok
}

// reset closes c with a TCP reset (SO_LINGER 0) where it is a TCP
// connection, else plainly.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// conn is an accepted connection: its state for the choice of a victim,
// and its place in the count, given back at its first Close.
type conn struct {
	net.Conn
	l       *Listener
	addr    netip.Addr
	hasAddr bool
	// Guarded by l.mu.
	state   http.ConnState
	since   time.Time // when it entered state
	dropped bool      // out of the count: closed, or chosen as a victim
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.dropLocked(c)
	c.l.mu.Unlock()
	return err
}
