package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/cli/clitest"
	clisidecar "github.com/handoff-dev/handoff/internal/cli/sidecar"
	"github.com/handoff-dev/handoff/internal/cli/version/client"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/memlimit"
	"github.com/handoff-dev/handoff/internal/procstat"
	"github.com/handoff-dev/handoff/internal/sockettest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/version"
	"github.com/handoff-dev/handoff/worker"
)

// The flood of the issue: 16,000 idle TCP connections opened at once from
// one other pod. Its bounds on this machine: floodConns connections (file
// descriptors of the test process, within its RLIMIT_NOFILE), dialed by
// floodDialers at once, each dial given floodDialTimeout, the whole flood
// given floodWithin; loopback only.
const (
	floodConns       = 16000
	floodDialers     = 32
	floodDialTimeout = time.Second
	floodWithin      = 15 * time.Second
	// injectedMemoryLimit is the sidecar's memory limit in injected pods
	// (handoff inject --sidecar-memory-limit, the chart's
	// sidecar.resources.limits.memory): 128 MiB.
	injectedMemoryLimit = 128 << 20
)

// TestHandoverUnderConnectionFlood: a real handoff sidecar process (the
// bin/handoff-sidecar injected pods run, without the race detector) on the
// real apiserver, with a worker Agent as its app. Another pod (127.0.0.2)
// opens 16,000 idle TCP connections to the probe and metrics port and holds
// them; meanwhile the kubelet's probes (127.0.0.1, a new connection each,
// 1 s timeout as the kubelet's default) keep being answered (never
// failureThreshold 3 in a row), a preStop call completes the sequence and
// releases the Lease, and the sidecar's peak resident memory (VmHWM) stays
// under the injected 128 MiB limit.
func TestHandoverUnderConnectionFlood(t *testing.T) {
	env := kubetest.Get(t)
	ensureFileLimit(t, floodConns+2048)
	sp := startSidecarProcess(t, env)
	metrics, control, token, agent, cmd, exited, pid := sp.metrics, sp.control, sp.token, sp.agent, sp.cmd, sp.exited, sp.pid
	// The runtime took 3/4 of the container's limit.
	if got, want := metric(t, metrics, "go_gc_gomemlimit_bytes"), float64(injectedMemoryLimit/4*3); got != want {
		t.Errorf("the sidecar's go_gc_gomemlimit_bytes = %v with %s=%d; want %v (3/4)", got, memlimit.EnvVar, injectedMemoryLimit, want)
	}
	// Which build runs: handoff_build_info, its labels sorted by name, as
	// the binary's own version command reports it.
	out, err := exec.Command(cmd.Path, "version", "-o", "json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var report client.Report
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("handoff-sidecar version -o json: %v\n%s", err, out)
	}
	info := report.Client
	if got, want := metricLine(t, metrics, version.BuildInfoName+"{"), fmt.Sprintf(`%s{commit=%q,component="sidecar",goversion=%q,version=%q} 1`, version.BuildInfoName, info.Commit, info.GoVersion, info.Version); got != want {
		t.Errorf("the sidecar's /metrics: %q, want %q", got, want)
	}
	before, err := procstat.Memory(pid)
	if err != nil {
		t.Fatal(err)
	}

	// The kubelet: a probe every 100 ms from the node's address.
	probes := startProber(metrics, 100*time.Millisecond)
	f := openFlood(t, "127.0.0.2", metrics, floodConns)
	t.Cleanup(f.close)
	during, _ := procstat.Memory(pid)
	t.Logf("flood from 127.0.0.2: %d dials in %s, %d connected (%d of them still open), %d failed (%d reset by the server before the dial returned); sidecar RSS %.1f MiB before, %.1f MiB after",
		len(f.conns)+f.failed, f.took.Round(time.Millisecond), len(f.conns), f.open(), f.failed, f.reset, before["VmRSS"], during["VmRSS"])

	// The flood held, the hook runs.
	time.Sleep(2 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := prestop.Call(ctx, control, token, 5*time.Second)
	if err != nil {
		t.Errorf("preStop under the flood: %v; want the sequence's report", err)
	} else {
		if rep.Outcome != protocol.OutcomeDrained || len(rep.Leases) != 1 || !rep.Leases[0].Released {
			t.Errorf("preStop under the flood: outcome %s, Leases %+v; want Drained and the Lease released", rep.Outcome, rep.Leases)
		}
		if _, leading := agent.Leader("work"); leading {
			t.Errorf("the worker still leads after the sequence; want leadership revoked")
		}
	}
	stats := probes.stop()
	peak, err := procstat.Memory(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probes from 127.0.0.1 during the flood: %d, %d failed (longest run %d); sidecar peak RSS (VmHWM) %.1f MiB, RSS now %.1f MiB",
		stats.total, stats.failed, stats.longestRun, peak["VmHWM"], peak["VmRSS"])
	for _, e := range stats.errors {
		t.Logf("  probe failed: %s", e)
	}
	if stats.longestRun >= 3 {
		t.Errorf("%d probes in a row failed under the flood (first: %s); the kubelet restarts the sidecar at 3 (failureThreshold)", stats.longestRun, stats.errors[0])
	}
	if limit := float64(injectedMemoryLimit) / (1 << 20); peak["VmHWM"] >= limit {
		t.Errorf("sidecar peak RSS %.1f MiB under the flood; want under the injected limit of %.0f MiB (the container is OOM-killed there)", peak["VmHWM"], limit)
	}
	f.close()
	terminate(t, cmd, exited, "sidecar after the flood")
}

// sidecarProcess is a real handoff sidecar process as an injected pod runs
// it (bin/handoff-sidecar, without the race detector; the sockets in a
// run directory; its metrics and probe port on loopback TCP) on the test's
// apiserver, leading its Lease "work", with a worker Agent as its app.
type sidecarProcess struct {
	ns, pod string // the pod's namespace and name
	metrics string
	control protocol.Endpoint
	token   string
	agent   *worker.Agent
	cmd     *exec.Cmd
	exited  <-chan error
	pid     int
}

// startSidecarProcess starts one, and returns once it leads and its worker
// is told so; it is killed when the test ends.
func startSidecarProcess(t *testing.T, env *kubetest.Env) *sidecarProcess {
	t.Helper()
	bin := sidecarBuild(t)
	ns := env.Namespace(t)
	pod := env.Pod(t, ns, "worker-0", 30)
	identity := "worker-0_" + string(pod.UID)
	tokenPath, token, agent := clitest.TokenAgent(t)
	// The pod's handoff-run volume: the sockets, as injected.
	run := sockettest.Dir(t)
	appAddr := protocol.Endpoint{Network: "unix", Address: filepath.Join(run, "app.sock")}
	control := protocol.Endpoint{Network: "unix", Address: filepath.Join(run, "control.sock")}
	appLn, err := appAddr.Listen(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	app := &http.Server{Handler: agent.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = app.Serve(appLn) }()
	t.Cleanup(func() { _ = app.Close() })

	metrics := freeLoopbackAddr(t)
	cmd := exec.Command(bin, "sidecar")
	cmd.Env = append(os.Environ(), "HANDOFF_TOKEN_FILE="+tokenPath,
		"HANDOFF_POD_NAME=worker-0", "HANDOFF_POD_NAMESPACE="+ns, "HANDOFF_POD_UID="+string(pod.UID),
		"HANDOFF_LEASES=work", "HANDOFF_KUBECONFIG="+env.Kubeconfig,
		"HANDOFF_CONTROL_ADDR="+control.String(), "HANDOFF_METRICS_ADDR="+metrics,
		"HANDOFF_APP_URL="+appAddr.String(),
		"HANDOFF_LEASE_DURATION=3s", "HANDOFF_RENEW_DEADLINE=2s", "HANDOFF_RETRY_PERIOD=250ms",
		// As the injector gives it (downward API, limits.memory, in bytes).
		memlimit.EnvVar+"="+strconv.Itoa(injectedMemoryLimit))
	exited := startProcess(t, cmd)
	pid := cmd.Process.Pid

	kubetest.WaitFor(t, 30*time.Second, "the sidecar to lead the Lease and answer /healthz", func() bool {
		l, err := env.Client.CoordinationV1().Leases(ns).Get(context.Background(), "work", metav1.GetOptions{})
		return err == nil && ptr.Deref(l.Spec.HolderIdentity, "") == identity && clitest.Probe(metrics) == nil
	})
	kubetest.WaitFor(t, 10*time.Second, "the worker to be told it leads", func() bool { _, ok := agent.Leader("work"); return ok })
	return &sidecarProcess{ns: ns, pod: "worker-0", metrics: metrics, control: control, token: token, agent: agent, cmd: cmd, exited: exited, pid: pid}
}

// sidecarBuild builds bin/handoff-sidecar, as the image has it
// (cmd/handoff-sidecar, no race detector), into a temporary directory.
func sidecarBuild(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "handoff-sidecar")
	build := exec.Command("go", "build", "-o", bin, "../handoff-sidecar")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// ensureFileLimit raises the test process's RLIMIT_NOFILE to n if it is
// lower (root may raise the hard limit too), or fails the test.
func ensureFileLimit(t testing.TB, n uint64) {
	t.Helper()
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
	if l.Cur >= n {
		return
	}
	want := syscall.Rlimit{Cur: n, Max: max(n, l.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		t.Fatalf("the flood needs %d file descriptors; RLIMIT_NOFILE is %d (hard %d) and raising it failed: %v", n, l.Cur, l.Max, err)
	}
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// metric reads one unlabelled metric from /metrics at addr.
func metric(t testing.TB, addr, name string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(strings.TrimPrefix(metricLine(t, addr, name+" "), name+" "), 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// metricLine returns the first line of /metrics at addr that starts with
// prefix.
func metricLine(t testing.TB, addr, prefix string) string {
	t.Helper()
	resp, err := clitest.ProbeClient.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		if strings.HasPrefix(s.Text(), prefix) {
			return s.Text()
		}
	}
	t.Fatalf("no line %s… in /metrics at %s", prefix, addr)
	return ""
}

type prober struct {
	done  chan struct{}
	wg    sync.WaitGroup
	stats probeStats
}

type probeStats struct {
	total, failed, longestRun int
	errors                    []string
}

// startProber probes addr every period until stop.
func startProber(addr string, period time.Duration) *prober {
	p := &prober{done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		run := 0
		for {
			select {
			case <-p.done:
				return
			case <-time.After(period):
			}
			start := time.Now()
			err := clitest.Probe(addr)
			p.stats.total++
			if err == nil {
				run = 0
				continue
			}
			run++
			p.stats.failed++
			p.stats.longestRun = max(p.stats.longestRun, run)
			if len(p.stats.errors) < 10 {
				p.stats.errors = append(p.stats.errors, fmt.Sprintf("after %s: %v", time.Since(start).Round(time.Millisecond), err))
			}
		}
	}()
	return p
}

func (p *prober) stop() probeStats {
	close(p.done)
	p.wg.Wait()
	return p.stats
}

type flood struct {
	mu     sync.Mutex
	conns  []net.Conn
	failed int // dials that failed, reset ones included
	reset  int // dials the server reset before they returned
	took   time.Duration
	once   sync.Once
}

// openFlood dials n TCP connections from the address from to addr,
// floodDialers at a time, within floodWithin, and keeps those that
// connect open and idle (it sends nothing) until close.
func openFlood(t *testing.T, from, addr string, n int) *flood {
	t.Helper()
	f := &flood{}
	d := net.Dialer{Timeout: floodDialTimeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)},
		// The port is chosen at connect, by the 4-tuple, not at bind among
		// every port of the address: a bind-time search slows the dials to
		// about 1,000 a second past a few thousand.
		Control: func(_, _ string, c syscall.RawConn) error {
			var err error
			if cerr := c.Control(func(fd uintptr) {
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
			}); cerr != nil {
				return cerr
			}
			return err
		}}
	ctx, cancel := context.WithTimeout(context.Background(), floodWithin)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range floodDialers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				f.mu.Lock()
				if err != nil {
					f.failed++
					if errors.Is(err, syscall.ECONNRESET) {
						f.reset++
					}
				} else {
					f.conns = append(f.conns, c)
				}
				f.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	f.took = time.Since(start)
	return f
}

// open is how many of the flood's connections the server has not closed: a
// peek that would block finds one open; EOF or a reset, closed.
func (f *flood) open() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	buf := make([]byte, 1)
	for _, c := range f.conns {
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			continue
		}
		_ = raw.Control(func(fd uintptr) {
			if _, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT); errors.Is(err, unix.EAGAIN) {
				n++
			}
		})
	}
	return n
}

func (f *flood) close() {
	f.once.Do(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			_ = c.Close()
		}
	})
}

// keepAlive holds one connection from the loopback address from to addr
// open and quiet, with a request every period (so the server's idle
// timeout never ends it), until ctx ends; held counts it while it is
// open. Over TLS when tlsConfig is not nil. It opens the connection and
// makes its first request holding a place in opening: a server that resets
// connections still waiting for their first request after a second (as
// connlimit does once its slots are full) resets slow handshakes, and
// hundreds at once on a loaded machine under -race never all finish.
func keepAlive(ctx context.Context, from, addr string, period time.Duration, tlsConfig *tls.Config, held *atomic.Int64, opening chan struct{}) {
	select {
	case opening <- struct{}{}:
	case <-ctx.Done():
		return
	}
	opened := false
	release := func() {
		if !opened {
			opened = true
			<-opening
		}
	}
	defer release()
	d := &net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	var c net.Conn
	var err error
	if tlsConfig != nil {
		c, err = tls.DialWithDialer(d, "tcp", addr, tlsConfig)
	} else {
		c, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return
	}
	defer func() { _ = c.Close() }()
	r := bufio.NewReader(c)
	counted := false
	defer func() {
		if counted {
			held.Add(-1)
		}
	}()
	for {
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			return
		}
		_ = resp.Body.Close()
		if !counted {
			counted = true
			held.Add(1)
			release()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
	}
}

// holdSlots keeps perAddr connections from each of froms to addr with
// keepAlive, each opened again when closed, until ctx ends; it returns the
// count of those open and a wait for them to end.
func holdSlots(ctx context.Context, froms []string, perAddr int, addr string, tlsConfig *tls.Config) (*atomic.Int64, func()) {
	var held atomic.Int64
	var wg sync.WaitGroup
	opening := make(chan struct{}, 8) // connections being opened at once
	for _, from := range froms {
		for range perAddr {
			wg.Go(func() {
				for ctx.Err() == nil {
					keepAlive(ctx, from, addr, 2*time.Second, tlsConfig, &held, opening)
					select {
					case <-ctx.Done():
					case <-time.After(200 * time.Millisecond):
					}
				}
			})
		}
	}
	return &held, wg.Wait
}

// A break test of issue 20: kept-alive connections, each with a request
// now and then, held every slot of the probe port: 16 from the node's own
// address (a node process, or a hostNetwork pod, shares the kubelet's),
// and 512 from 32 addresses. The kubelet's probes were reset or timed out,
// every one, and the liveness probe would restart the sidecar. Now a new
// connection takes the place of an idle one: the probes (127.0.0.1, a new
// connection each, 1 s timeout) are answered throughout, and the preStop
// still hands over.
func TestProbesUnderKeptAliveFloods(t *testing.T) {
	env := kubetest.Get(t)
	ensureFileLimit(t, 4096)
	sp := startSidecarProcess(t, env)
	for _, tc := range []struct {
		name  string
		froms []string
	}{
		{"from the node's address", []string{"127.0.0.1"}},
		{"from 32 addresses", func() []string {
			var froms []string
			for i := 1; i <= 32; i++ {
				froms = append(froms, fmt.Sprintf("127.0.1.%d", i))
			}
			return froms
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // stops by itself
			held, wait := holdSlots(ctx, tc.froms, clisidecar.ProbeTimeouts.Conns.PerAddr, sp.metrics, nil)
			defer func() { cancel(); wait() }()
			want := int64(len(tc.froms) * clisidecar.ProbeTimeouts.Conns.PerAddr)
			kubetest.WaitFor(t, 20*time.Second, fmt.Sprintf("%d kept-alive connections", want), func() bool { return held.Load() >= want })
			probes := startProber(sp.metrics, 250*time.Millisecond)
			time.Sleep(5 * time.Second) // past the header timeout, with requests every 2 s
			stats := probes.stop()
			t.Logf("%d kept-alive connections held; probes from 127.0.0.1: %d, %d failed (longest run %d)", held.Load(), stats.total, stats.failed, stats.longestRun)
			if stats.failed > 0 {
				t.Errorf("%d of %d probes failed (first: %s); want every one answered", stats.failed, stats.total, stats.errors[0])
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if rep, err := prestop.Call(ctx, sp.control, sp.token, 5*time.Second); err != nil || rep.Outcome != protocol.OutcomeDrained {
		t.Errorf("preStop after the floods: %+v, %v; want Drained", rep, err)
	}
	terminate(t, sp.cmd, sp.exited, "sidecar after the floods")
}
