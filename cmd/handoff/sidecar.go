package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/internal/connlimit"
	"github.com/handoff-dev/handoff/internal/memlimit"
	"github.com/handoff-dev/handoff/leaderelection"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/version"
)

// eventFlush bounds the wait, after the sequence ends, for its last Events
// to be written before the sidecar exits, and then for its last phase to be
// written on the pod; each wait ends as soon as they are
// (sidecar.EventFlush, Coordinator.WaitPhaseWritten).
const eventFlush = time.Second

var sidecarCmd = command{
	use:   "sidecar",
	short: "Run the coordinator: Lease elections and the shutdown sequence",
	long: `sidecar runs in the worker's pod. It competes for the configured Leases,
tells the worker about leadership, and on preStop (or SIGTERM) runs the
shutdown sequence: stop claiming, drain, fallback at the deadline, revoke
leadership, release the Leases.

Every setting is a flag, or an environment variable HANDOFF_<NAME>; flags win.`,
	setup: func(fs *pflag.FlagSet) func(invocation) error {
		flags := config.Flags(fs)
		return func(invocation) error {
			s, err := config.Load(flags, config.Environ(os.LookupEnv))
			if err != nil {
				return fmt.Errorf("invalid configuration:\n%w", err)
			}
			return runSidecar(s)
		}
	},
}

func runSidecar(s *config.Settings) error {
	// The pod and the token first: a sidecar that cannot start changes no
	// process-wide state (klog's logger) on its way out.
	for _, f := range []struct{ name, value, field string }{
		{"pod-name", s.PodName, "metadata.name"}, {"pod-namespace", s.PodNamespace, "metadata.namespace"},
	} {
		if f.value == "" {
			d, _ := config.Lookup(f.name)
			return fmt.Errorf("%s: required: %s, of the pod this sidecar runs in, for its Events, the watch of its deletion and its Leases (flag --%s or %s; injected pods have it from the downward API, %s)",
				f.name, d.Form, f.name, d.Env(), f.field)
		}
	}
	if s.TokenFile == "" {
		return fmt.Errorf("token-file: required: the file with the pod's token (flag --token-file or %s; injected pods have %s, and handoff install --token-file FILE writes one)", protocol.TokenFileEnv, protocol.TokenFile)
	}
	token, err := protocol.ReadTokenFile(s.TokenFile)
	if err != nil {
		return fmt.Errorf("token-file: %w", err)
	}
	log := newLogger(os.Stderr, s.LogLevel).WithValues("pod", s.PodNamespace+"/"+s.PodName)
	klog.SetLogger(log.WithName("client-go"))
	if err := setMemoryLimit(log); err != nil {
		return err
	}

	setHTTP2HealthCheck(os.LookupEnv, os.Setenv, s.RenewDeadline)
	rc, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		if s.Kubeconfig == "" {
			d, _ := config.Lookup("kubeconfig")
			// client-go's error suggests KUBERNETES_MASTER; its in-cluster
			// error is logged above it.
			ignored := ""
			if v, ok := os.LookupEnv("KUBECONFIG"); ok {
				ignored = fmt.Sprintf("; KUBECONFIG=%s is not read", v)
			}
			return fmt.Errorf("kubeconfig: not set, and not running in a pod (no in-cluster configuration): set a kubeconfig file's path (flag --kubeconfig or %s)%s", d.Env(), ignored)
		}
		return fmt.Errorf("kubeconfig: %s: %w", s.Kubeconfig, err)
	}
	rc.UserAgent = "handoff/" + version.Get()
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	// A pod alone holds every shard of its shard set.
	budget := leaderelection.ClientBudget(len(s.Leases)+len(s.Shards), s.RetryPeriod)
	leaseClient, err := kubernetes.NewForConfig(leaseConfig(rc, budget))
	if err != nil {
		return err
	}

	broadcaster := record.NewBroadcaster(record.WithContext(context.Background()))
	flush := sidecar.NewEventFlush()
	broadcaster.StartRecordingToSink(flush.Sink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events(s.PodNamespace)}))
	defer broadcaster.Shutdown()
	recorder := flush.Recorder(broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "handoff"}))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.NewBuildInfo("sidecar"))
	c, err := sidecar.New(sidecar.Options{
		Settings: s, Leases: leaseClient.CoordinationV1(), Pods: kube.CoreV1(),
		Events: recorder, Metrics: sidecar.NewMetrics(reg), Logger: log, Token: token,
		LeaseBudget: budget,
	})
	if err != nil {
		return err
	}

	control, err := listenControl(s.ControlAddr, c.ControlHandler(), log, controlTimeouts)
	if err != nil {
		return fmt.Errorf("control-addr: %w", err)
	}
	scrapes := sidecar.NewScrapeWatch(clock.RealClock{})
	probes, err := listen(s.MetricsAddr, sidecar.ProbesHandler(reg, c.Ready, scrapes), log, probeTimeouts)
	if err != nil {
		return fmt.Errorf("metrics-addr: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	c.Start(ctx)
	log.Info("handoff sidecar started", "identity", s.Identity(), "leases", s.Leases,
		"control", s.ControlAddr.String(), "metrics", s.MetricsAddr, "app", s.AppURL.String(), "version", version.Get(),
		"leaseClientQPS", budget.QPS, "leaseClientBurst", budget.Burst, "leaseCapacity", budget.Leases)

	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	got := <-sig
	signalled := time.Now()
	log.Info("signal received: running or joining the shutdown sequence", "signal", got.String())
	// A second signal ends the wait at once; the Leases then expire.
	sctx, cancel := context.WithCancel(context.Background())
	go func() { <-sig; cancel() }()
	rep, err := c.Signal(sctx)
	switch {
	case err != nil && !errors.Is(err, sidecar.ErrSidecarRestart):
		// The app was not told to stop leading: the Leases must expire, not
		// be freed under it.
		c.Abandon()
		log.Info("shutdown sequence abandoned by a second signal; Leases left to expire")
	case !flush.Wait(clock.RealClock{}, eventFlush):
		// Broadcaster.Shutdown cancels the writes under way.
		log.Info("exiting with Events not yet written", "waited", eventFlush.String())
	}
	if !c.WaitPhaseWritten(eventFlush) {
		log.Info("exiting with the pod's condition "+protocol.PodConditionCoordinating+" not yet written", "waited", eventFlush.String())
	}
	if err == nil && rep != nil {
		if kind := c.ControllerKind(); kind == "StatefulSet" {
			// Its replacement, of the same name, waits for this pod to be gone.
			log.Info("no wait for a scrape of the shutdown's metrics: the pod's StatefulSet replaces it only once it is gone")
		} else {
			lingerForScrape(log, scrapes, rep.Finished, s.MetricsLinger, killAt(rep, s.DeadlineMargin), sctx.Done())
		}
	}
	cancel()
	stop()
	joined := time.Now()
	for _, srv := range []*http.Server{control, probes} {
		sc, done := context.WithTimeout(context.Background(), time.Second)
		_ = srv.Shutdown(sc)
		done()
	}
	log.Info("exiting", "sinceSignal", time.Since(signalled).String(), "serversShutdown", time.Since(joined).String())
	return nil
}

// scrapeLingerMargin is the time kept, after a linger for a scrape, for the
// servers' shutdown (a second each, at most) before the kubelet's kill.
const scrapeLingerMargin = 2 * time.Second

// killAt is when the kubelet kills the pod's containers: the sequence's
// deadline plus the deadline margin the sequence kept before it.
func killAt(rep *protocol.Report, margin time.Duration) time.Time {
	return rep.Deadline.Add(margin)
}

// lingerForScrape waits, after the sequence that ended at finished, for one
// scrape of the metrics that reads its counts (sidecar.ScrapeWatch.Linger),
// for up to limit and never within scrapeLingerMargin of kill; stop ends it
// (a second signal).
func lingerForScrape(log logr.Logger, scrapes *sidecar.ScrapeWatch, finished time.Time, limit time.Duration, kill time.Time, stop <-chan struct{}) {
	limit = min(limit, time.Until(kill)-scrapeLingerMargin)
	result, waited := scrapes.Linger(finished, limit, stop)
	if result != sidecar.LingerNoScraper {
		log.Info("waited for a scrape of the shutdown's metrics", "result", string(result), "waited", waited.String(), "limit", limit.String())
	}
}

// setMemoryLimit gives the Go runtime its soft memory limit from the
// container's (internal/memlimit: 3/4 of it, from HANDOFF_MEMORY_LIMIT,
// unless GOMEMLIMIT is set) and logs it.
func setMemoryLimit(log logr.Logger) error {
	m, err := memlimit.Set(os.LookupEnv)
	if err != nil {
		return err
	}
	switch m.Source {
	case memlimit.EnvVar:
		log.Info("memory limit set", "bytes", m.Limit, "containerLimitBytes", m.Container,
			"share", fmt.Sprintf("%d/%d", memlimit.ShareNum, memlimit.ShareDen), "from", memlimit.EnvVar)
	case "GOMEMLIMIT":
		log.Info("memory limit set", "bytes", m.Limit, "from", "GOMEMLIMIT")
	default:
		log.Info("no memory limit set: neither GOMEMLIMIT nor " + memlimit.EnvVar + " (the container's limit, which injected pods have) is set")
	}
	return nil
}

// leaseConfig is the REST configuration of the Lease client: its own rate
// budget, sized for the sidecar's Leases (leaderelection.ClientBudget), so
// that other API use can never delay a renewal and the renewals of many
// Leases do not queue past their renew deadline. It has no
// rest.Config.Timeout: that would also cut the standby's watch of its Lease
// every timeout; the elector bounds each Lease read and write instead
// (leaderelection.RequestTimeout).
func leaseConfig(rc *rest.Config, b leaderelection.Budget) *rest.Config {
	lrc := rest.CopyConfig(rc)
	lrc.QPS, lrc.Burst = b.QPS, b.Burst
	return lrc
}

// setHTTP2HealthCheck sets client-go's HTTP/2 health check (the
// HTTP2_READ_IDLE_TIMEOUT_SECONDS and HTTP2_PING_TIMEOUT_SECONDS variables,
// read when a transport is built, whole seconds; defaults 30 s and 15 s)
// from the renew deadline (http2HealthCheck), each unless already set. A
// request timeout alone does not save the Lease from a connection that is
// open but dead: the retry goes out on the same connection. The health
// check closes it inside the renew deadline, and the next renewal dials
// anew.
func setHTTP2HealthCheck(lookup func(string) (string, bool), set func(string, string) error, renewDeadline time.Duration) {
	idle, ping := http2HealthCheck(renewDeadline)
	for name, d := range map[string]time.Duration{"HTTP2_READ_IDLE_TIMEOUT_SECONDS": idle, "HTTP2_PING_TIMEOUT_SECONDS": ping} {
		if _, ok := lookup(name); !ok {
			_ = set(name, strconv.Itoa(int(d/time.Second))) // a valid name and value cannot fail
		}
	}
}

// http2HealthCheck is the read-idle and the ping timeout of the HTTP/2
// health check, in whole seconds, at least 1 s each: a fifth and a half of
// the renew deadline (2 s and 5 s at the default 10 s), so a dead
// connection is closed within seven tenths of it, with a retry period left
// for a renewal on a new one. The ping timeout is the longer: an apiserver
// busy on a loaded node answers a ping late, and a ping timeout of 2 s was
// seen to drop live connections by the hundred, each taking the sidecar's
// watches with it (docs/performance.md, scale).
func http2HealthCheck(renewDeadline time.Duration) (readIdle, ping time.Duration) {
	return max(time.Second, (renewDeadline / 5).Truncate(time.Second)), max(time.Second, (renewDeadline / 2).Truncate(time.Second))
}

// serverTimeouts are the limits of one server's connections. The timeouts
// (net/http's http.Server fields of the same names): a client that sends
// its request, or reads the answer, slower than that, or keeps an idle
// connection longer, is cut off, so no client holds a connection for long.
// conns: how many it may hold at once (internal/connlimit).
type serverTimeouts struct {
	readHeader, read, write, idle time.Duration
	conns                         connlimit.Limits
}

// maxHeaderBytes bounds a request's header on every listen server (8 KiB,
// and the 4 KiB net/http reads past it; its default is 1 MiB, read into
// memory): the kubelet's probes, a scrape and the hook's calls send well
// under 1 KiB. A larger header is answered 431. A connection sending the largest header holds about twice
// it (the bytes read and their parse) over its idle cost (idleConnBytes)
// while the header is read: at most the read-header timeout.
const maxHeaderBytes = 8 << 10

// idleConnBytes is what one idle connection (connected, nothing sent)
// costs the sidecar, measured by BenchmarkIdleConnectionMemory on the
// probe server (2026-12-03, amd64, go1.27.3; a fresh process, 4,000
// connections): 4.1 KiB of goroutine stack and 10.2 KiB of heap (net/http's
// conn, its 4 KiB read and write buffers), of which 7.8 KiB is resident
// while idle, plus about 3.7 KiB of kernel memory for the socket (slab
// objects TCP, sock_inode_cache, filp, dentry, eventpoll_epi; charged to
// the container's memory cgroup, not in RSS). 16,000 of them, the issue's
// flood, are 280 MiB: over any limit the sidecar is given. The caps are
// sized from it.
const idleConnBytes = 18 << 10

// probeConnBudget is the most the probe port's connections may cost idle:
// 9 MiB, 7% of the injected 128 MiB limit, over a sidecar of 28 MiB
// resident (docs/performance.md). It makes probeTimeouts' total 512.
const probeConnBudget = 9 << 20

var (
	// probeTimeouts: the kubelet's probes and metrics scrapes send no body
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
	probeTimeouts = serverTimeouts{readHeader: 5 * time.Second, read: 5 * time.Second, write: 10 * time.Second, idle: 30 * time.Second,
		conns: connlimit.Limits{Total: probeConnBudget / idleConnBytes, PerAddr: 16}}
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
	controlTimeouts = serverTimeouts{readHeader: 5 * time.Second, read: 5 * time.Second, write: 10 * time.Second, idle: 5 * time.Second,
		conns: connlimit.Limits{Total: 64, PerAddr: 64}}
)

// listen binds addr before returning, so a busy port is an error at start,
// and serves h there within t: its timeouts, maxHeaderBytes, and its
// connection caps (connlimit.Listen: past t.conns.Total open, or
// t.conns.PerAddr from one address, a new connection takes the place of
// an idle or long-waiting one, else is reset at once).
func listen(addr string, h http.Handler, log logr.Logger, t serverTimeouts) (*http.Server, error) {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	return serve(ln, h, log, t), nil
}

// listenControl makes the control API's socket (protocol.Endpoint.Listen:
// a stale one replaced, anything else at its path refused), or binds its
// TCP address where the pod opted into one, before returning.
func listenControl(e protocol.Endpoint, h http.Handler, log logr.Logger, t serverTimeouts) (*http.Server, error) {
	if e.Network == "tcp" {
		return listen(e.Address, h, log, t)
	}
	ln, err := e.Listen(context.Background())
	if err != nil {
		return nil, err
	}
	return serve(ln, h, log, t), nil
}

// serve serves h on ln within t until the server is shut down: its
// timeouts, maxHeaderBytes and its connection caps (connlimit.Listen; a
// socket's connections count against the total only).
func serve(ln net.Listener, h http.Handler, log logr.Logger, t serverTimeouts) *http.Server {
	limited := connlimit.Listen(ln, t.conns)
	srv := &http.Server{Addr: ln.Addr().String(), Handler: h, ReadHeaderTimeout: t.readHeader, ReadTimeout: t.read, WriteTimeout: t.write, IdleTimeout: t.idle,
		MaxHeaderBytes: maxHeaderBytes, ConnState: limited.ConnState}
	go func() {
		if err := srv.Serve(limited); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "serving stopped", "addr", srv.Addr)
		}
	}()
	return srv
}
