package protocol

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Where the sidecar and the worker listen. By default each serves on a Unix
// socket in the pod's handoff-run volume, which the injector mounts into
// the sidecar and the worker container alone (the hook runs in the worker
// container): no other container of the pod, no other pod and no node
// process without root can open it, and nothing can read its calls off the
// pod's loopback. TCP on loopback stays possible when a pod opts in
// (docs/protocol.md, "Transport", with its risks).
const (
	// RunDir is where the injector mounts the handoff-run volume.
	RunDir = "/handoff-run"
	// ControlSocket is the sidecar's control API socket in an injected pod.
	ControlSocket = RunDir + "/control.sock"
	// AppSocket is the worker's app API socket in an injected pod.
	AppSocket = RunDir + "/app.sock"
	// AppURLEnv names the environment variable with the app API's address
	// (Endpoint's form: "unix:///handoff-run/app.sock", or by opt-in
	// "http://127.0.0.1:7452"), which the injector sets in the sidecar and
	// the worker container; the worker serves there.
	AppURLEnv = "HANDOFF_APP_URL"
	// ControlAddrEnv names the environment variable with the sidecar's
	// control API address (Endpoint's form), which the injector sets in
	// the sidecar and the worker container, whose preStop hook calls it.
	ControlAddrEnv = "HANDOFF_CONTROL_ADDR"
	// SocketMode is the mode of a socket an Endpoint makes: the sidecar and
	// the worker may run as different users, and the volume, not the mode,
	// decides who can reach it; every call is signed besides (Sign).
	SocketMode = 0o666
	// maxSocketPath bounds a socket's path in bytes: sockaddr_un holds 108
	// bytes on Linux, the final NUL included.
	maxSocketPath = 107
)

// Endpoint is an address of one side of the protocol: a Unix socket, or a
// TCP address on loopback.
type Endpoint struct {
	// Network is "unix" or "tcp".
	Network string
	// Address is the socket's absolute path, or the TCP host:port.
	Address string
}

// ParseEndpoint reads an address: "unix://" and an absolute socket path of
// at most 107 bytes (unix:///handoff-run/app.sock), or a loopback TCP
// address as a host:port or an http URL without path, query or fragment
// (127.0.0.1:7450, http://127.0.0.1:7452; port 0 picks a free port; a
// loopback IP, not the name localhost, which names two). The error says
// what is wrong and the accepted forms.
func ParseEndpoint(s string) (Endpoint, error) {
	bad := func(format string, args ...any) (Endpoint, error) {
		return Endpoint{}, &EndpointError{Value: s, Reason: fmt.Sprintf(format, args...)}
	}
	if p, ok := strings.CutPrefix(s, "unix://"); ok {
		switch {
		case !filepath.IsAbs(p):
			return bad("the socket path is not absolute")
		case filepath.Clean(p) != p:
			return bad("the socket path is not clean (%s)", filepath.Clean(p))
		case len(p) > maxSocketPath:
			return bad("the socket path has %d bytes, more than the %d a Unix socket address holds", len(p), maxSocketPath)
		}
		return Endpoint{Network: "unix", Address: p}, nil
	}
	hostport := s
	if rest, ok := strings.CutPrefix(s, "http://"); ok {
		u, err := url.Parse(s)
		if err != nil || u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.Contains(rest, "?") || strings.Contains(rest, "#") ||
			strings.TrimRight(u.EscapedPath(), "/") != "" {
			return bad("an http address has a host and port only (no user, path, query or fragment)")
		}
		hostport = u.Host
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return bad("not a host:port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return bad("port %q is not a number from 0 to 65535", port)
	}
	if host == "localhost" {
		// It names both 127.0.0.1 and ::1 in a pod's /etc/hosts: a server
		// binds one, a client tries ::1 first, and a neighbour container
		// that binds the other gets the calls, with no privilege at all.
		return bad("localhost names both 127.0.0.1 and ::1, and a neighbour could serve the one the server does not bind: give the loopback address itself, like 127.0.0.1")
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return bad("%q is not a loopback address: the protocol is never spoken beyond the pod's loopback", host)
	}
	return Endpoint{Network: "tcp", Address: hostport}, nil
}

// EndpointForms are the forms ParseEndpoint accepts, as its errors say.
const EndpointForms = "unix:// and an absolute socket path, like unix:///handoff-run/app.sock, or a loopback address, like http://127.0.0.1:7452 or 127.0.0.1:7450"

// EndpointError is an address ParseEndpoint refused.
type EndpointError struct {
	Value  string // the address as given
	Reason string // what is wrong with it
}

func (e *EndpointError) Error() string {
	return fmt.Sprintf("%q: %s; want %s", e.Value, e.Reason, EndpointForms)
}

// String is the address in ParseEndpoint's form: unix:///path or
// http://host:port.
func (e Endpoint) String() string {
	if e.Network == "unix" {
		return "unix://" + e.Address
	}
	return "http://" + e.Address
}

// URL is the base URL of calls to e: http://host:port, or for a socket
// http://localhost (the Host header a socket's server sees).
func (e Endpoint) URL() string {
	if e.Network == "unix" {
		return "http://localhost"
	}
	return "http://" + e.Address
}

// Listen listens on e. A TCP endpoint binds its loopback address. A socket
// is made with SocketMode in an existing directory: Listen refuses a path
// that exists and is not a socket (a file, a link, a directory) and one a
// process still serves, and removes a stale socket (its server gone)
// first. Closing the listener removes the socket.
func (e Endpoint) Listen(ctx context.Context) (net.Listener, error) {
	var lc net.ListenConfig
	if e.Network != "unix" {
		return lc.Listen(ctx, "tcp", e.Address)
	}
	switch fi, err := os.Lstat(e.Address); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("socket %s: %w", e.Address, err)
	case fi.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("socket %s: the path exists and is not a socket (%s); refusing to replace it", e.Address, fi.Mode().Type())
	default:
		conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "unix", e.Address)
		if err == nil {
			_ = conn.Close()
			return nil, fmt.Errorf("socket %s: another process serves it", e.Address)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("socket %s: checking whether it is stale: %w", e.Address, err)
		}
		if err := os.Remove(e.Address); err != nil {
			return nil, fmt.Errorf("socket %s: removing the stale socket: %w", e.Address, err)
		}
	}
	ln, err := lc.Listen(ctx, "unix", e.Address)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(e.Address, SocketMode); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("socket %s: %w", e.Address, err)
	}
	return ln, nil
}

// ErrNotASocket is wrapped by a dial of a socket endpoint whose path is not
// a socket (a file, a directory, or a symbolic link, which is not
// followed).
var ErrNotASocket = errors.New("not a socket")

// Dial connects to e, whatever network and address the caller names (an
// http.Transport's DialContext). A socket's path must be a socket itself,
// not a link to one: the error wraps ErrNotASocket; one that does not exist
// yet fails as a refused connection does (syscall.ECONNREFUSED), so a
// caller that retries a server still starting retries it too.
func (e Endpoint) Dial(ctx context.Context, _, _ string) (net.Conn, error) {
	var d net.Dialer
	if e.Network != "unix" {
		return d.DialContext(ctx, "tcp", e.Address)
	}
	fi, err := os.Lstat(e.Address)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, noSocketError{e.Address}
	case err != nil:
		return nil, err
	case fi.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("socket %s: %w (%s); refusing to connect", e.Address, ErrNotASocket, fi.Mode().Type())
	}
	return d.DialContext(ctx, "unix", e.Address)
}

// noSocketError is a dial of a socket path where there is none: its server
// has not made it yet, or has closed it and gone. It is a refused
// connection (errors.Is syscall.ECONNREFUSED) as much as a missing file.
type noSocketError struct{ path string }

func (e noSocketError) Error() string {
	return "dial unix " + e.path + ": no socket there (its server has not made it yet, or is gone)"
}

func (e noSocketError) Is(target error) bool {
	return target == syscall.ECONNREFUSED || target == fs.ErrNotExist
}

// Transport returns an http.Transport for calls to e: never through a
// proxy, with idle connections kept up to idle (0: net/http's default,
// none kept past 90 s).
func (e Endpoint) Transport(maxIdlePerHost int, idle time.Duration) *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         e.Dial,
		MaxIdleConnsPerHost: maxIdlePerHost,
		IdleConnTimeout:     idle,
	}
}

// NoRedirects is an http.Client CheckRedirect that follows none: a signed
// call goes to its endpoint only, and an answer that redirects is returned
// as it is.
func NoRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
