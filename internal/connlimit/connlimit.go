// Package connlimit bounds the connections a server holds open, so that a
// flood of idle connections costs it a bounded amount of memory and one
// client address cannot take every slot.
//
// Listen wraps a listener with two caps:
//   - a total: at most Total connections are open at once
//     (golang.org/x/net/netutil.LimitListener). Past it, Accept waits for
//     one to close; the connections behind wait in the kernel's accept
//     queue (its backlog, net.core.somaxconn), which costs the process
//     nothing, and are taken in turn.
//   - a per-address cap: at most PerAddr of the open connections come from
//     any one remote IP address. A connection past it is closed at once, as
//     soon as it is accepted, with a TCP reset (SO_LINGER 0: no TIME_WAIT
//     kept for it), before a byte is read or written, and Accept goes on to
//     the next one: it never takes a slot of the total for longer than that.
//
// So a flood from one address holds at most PerAddr slots and the rest stay
// free for the others (the kubelet's probes come from the node's address,
// a scraper from its pod's). Connections with no IP address (Unix sockets)
// count against the total only.
//
// Addresses are compared exactly (IPv4-mapped IPv6 as IPv4): a client that
// can send from many addresses gets PerAddr at each, and all the containers
// of a pod share the loopback addresses, so on a loopback listener only the
// total protects.
package connlimit

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"golang.org/x/net/netutil"
)

// Limits are the caps of one listener.
type Limits struct {
	// Total is the most connections open at once, at least 1.
	Total int
	// PerAddr is the most open connections from one remote IP address, at
	// least 1; at most Total.
	PerAddr int
}

// Listener is a listener with Limits (see the package doc): a
// netutil.LimitListener over the per-address cap over the wrapped
// listener. Closing it closes the wrapped listener; the connections it
// accepted stay open until closed.
type Listener struct {
	net.Listener
	addrs *addrListener
}

// Listen wraps ln with the limits l. It panics if l.Total or l.PerAddr is
// below 1: a listener that can never accept is a programming error.
func Listen(ln net.Listener, l Limits) *Listener {
	if l.Total < 1 || l.PerAddr < 1 {
		panic("connlimit: Total and PerAddr must be at least 1")
	}
	a := &addrListener{Listener: ln, perAddr: min(l.PerAddr, l.Total), open: map[netip.Addr]int{}}
	return &Listener{Listener: netutil.LimitListener(a, l.Total), addrs: a}
}

// Refused is how many connections were closed at once for being past the
// per-address cap, since Listen.
func (l *Listener) Refused() uint64 { return l.addrs.refused.Load() }

// addrListener is the per-address cap. LimitListener calls its Accept
// holding a slot of the total, which the connection it returns keeps.
type addrListener struct {
	net.Listener
	perAddr int
	refused atomic.Uint64

	mu   sync.Mutex
	open map[netip.Addr]int // open connections by remote address; no zero entries
}

// Accept returns the next connection from an address with fewer than
// perAddr open, closing at once the others it accepts meanwhile. Its
// errors are the wrapped listener's.
func (l *addrListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr, ok := remoteIP(c)
		if !ok {
			return c, nil
		}
		l.mu.Lock()
		n := l.open[addr]
		if n >= l.perAddr {
			l.mu.Unlock()
			l.refused.Add(1)
			reset(c)
			continue
		}
		l.open[addr] = n + 1
		l.mu.Unlock()
		return &conn{Conn: c, l: l, addr: addr}, nil
	}
}

func (l *addrListener) release(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[addr] <= 1 {
		delete(l.open, addr)
	} else {
		l.open[addr]--
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

// conn gives back its address's slot once, at its first Close.
type conn struct {
	net.Conn
	l        *addrListener
	addr     netip.Addr
	released sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.released.Do(func() { c.l.release(c.addr) })
	return err
}
