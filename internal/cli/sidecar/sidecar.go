// Package sidecar is the sidecar command: the coordinator process that
// runs in each injected pod, competes for its Leases and, on preStop or
// SIGTERM, runs the shutdown sequence (package sidecar of the module does
// the work; this package starts it, serves its ports, and exits in order).
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
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
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/serve"
	"github.com/handoff-dev/handoff/internal/memlimit"
	"github.com/handoff-dev/handoff/leaderelection"
	"github.com/handoff-dev/handoff/protocol"
	coord "github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/version"
)

// eventFlush bounds the wait, after the sequence ends, for its last Events
// to be written before the sidecar exits, and then for its last phase to be
// written on the pod; each wait ends as soon as they are
// (sidecar.EventFlush, Coordinator.WaitPhaseWritten).
const eventFlush = time.Second

// Command is the sidecar command.
var Command = command.Command{
	Use:   "sidecar",
	Short: "Run the coordinator: Lease elections and the shutdown sequence",
	Long: `sidecar runs in the worker's pod. It competes for the configured Leases,
tells the worker about leadership, and on preStop (or SIGTERM) runs the
shutdown sequence: stop claiming, drain, fallback at the deadline, revoke
leadership, release the Leases.

Every setting is a flag, or an environment variable HANDOFF_<NAME>; flags win.`,
	Setup: func(fs *pflag.FlagSet) func(command.Invocation) error {
		flags := config.Flags(fs)
		return func(command.Invocation) error {
			s, err := config.Load(flags, config.Environ(os.LookupEnv))
			if err != nil {
				return fmt.Errorf("invalid configuration:\n%w", err)
			}
			return run(s)
		}
	},
}

// run is the sidecar process with the settings s, as an outline: set up,
// wait for the signal, then the ordered exit. It returns an error only when
// the sidecar cannot start; once started, it returns nil when it exits.
func run(s *config.Settings) error {
	// Refuse a pod or a token that cannot work before anything
	// process-wide (klog's logger) changes.
	token, err := preflight(s)
	if err != nil {
		return err
	}
	// The logger, the API clients, the coordinator and its two servers:
	// the Leases are competed for from here.
	p, err := start(s, token)
	if err != nil {
		return err
	}
	defer p.broadcaster.Shutdown()
	// Run until the kubelet (or a preStop hook's caller) signals.
	got := <-p.signals
	return p.exit(got)
}

// process is a started sidecar: what its exit stops, in order.
type process struct {
	s           *config.Settings
	log         logr.Logger
	c           *coord.Coordinator
	broadcaster record.EventBroadcaster
	flush       *coord.EventFlush
	// control and probes are the control API's and the probe port's
	// servers.
	control, probes *http.Server
	// stop ends the coordinator's context.
	stop    context.CancelFunc
	signals chan os.Signal
}

// exit is the ordered exit after the signal got: each step one call, in
// the order the pod's other parties need it.
func (p *process) exit(got os.Signal) error {
	signalled := time.Now()
	p.log.Info("signal received: running or joining the shutdown sequence", "signal", got.String())
	// A second signal ends every wait below at once; the Leases then expire.
	sctx, cancel := p.secondSignalCancels()
	// The sequence: stop claiming, drain, hand back, release the Leases
	// (or join the one a preStop hook started).
	_, err := p.c.Signal(sctx)
	// Its Events written (or, abandoned, its Leases left to expire), so
	// the pod's history says how it ended.
	p.flushEvents(err)
	// Its phase written on the pod, for handoff status. No wait for a
	// scrape: the webhook counts the outcome from the ShutdownFinished
	// Event flushed above.
	p.waitPhaseWritten()
	cancel()
	p.stop()
	// The control and probe ports closed, a second each at most.
	joined := time.Now()
	p.shutdownServers()
	p.log.Info("exiting", "sinceSignal", time.Since(signalled).String(), "serversShutdown", time.Since(joined).String())
	return nil
}

// preflight checks the pod's identity and reads its token: a sidecar
// without them cannot take a Lease nor be called.
func preflight(s *config.Settings) (token string, err error) {
	for _, f := range []struct{ name, value, field string }{
		{"pod-name", s.PodName, "metadata.name"}, {"pod-namespace", s.PodNamespace, "metadata.namespace"},
	} {
		if f.value == "" {
			d, _ := config.Lookup(f.name)
			return "", fmt.Errorf("%s: required: %s, of the pod this sidecar runs in, for its Events, the watch of its deletion and its Leases (flag --%s or %s; injected pods have it from the downward API, %s)",
				f.name, d.Form, f.name, d.Env(), f.field)
		}
	}
	if s.TokenFile == "" {
		return "", fmt.Errorf("token-file: required: the file with the pod's token (flag --token-file or %s; injected pods have %s, and handoff install --token-file FILE writes one)", protocol.TokenFileEnv, protocol.TokenFile)
	}
	token, err = protocol.ReadTokenFile(s.TokenFile)
	if err != nil {
		return "", fmt.Errorf("token-file: %w", err)
	}
	return token, nil
}

// start sets the process up: the logger, the memory limit, the API
// clients, the Event recorder, the metrics, the coordinator and its
// servers; then it starts the coordinator and listens for the signals.
func start(s *config.Settings, token string) (*process, error) {
	log := newLogger(os.Stderr, s.LogLevel).WithValues("pod", s.PodNamespace+"/"+s.PodName)
	klog.SetLogger(log.WithName("client-go"))
	if err := setMemoryLimit(log); err != nil {
		return nil, err
	}
	setHTTP2HealthCheck(os.LookupEnv, os.Setenv, s.RenewDeadline)
	rc, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		return nil, kubeconfigError(s, err)
	}
	rc.UserAgent = "handoff/" + version.Get()
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	// A pod alone holds every shard of its shard set.
	budget := leaderelection.ClientBudget(len(s.Leases)+len(s.Shards), s.RetryPeriod)
	leaseClient, err := kubernetes.NewForConfig(leaseConfig(rc, budget))
	if err != nil {
		return nil, err
	}

	p := &process{s: s, log: log, flush: coord.NewEventFlush()}
	p.broadcaster = record.NewBroadcaster(record.WithContext(context.Background()), record.WithCorrelatorOptions(coord.CorrelatorOptions()))
	p.broadcaster.StartRecordingToSink(p.flush.Sink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events(s.PodNamespace)}))
	recorder := p.flush.Recorder(p.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "handoff"}))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.NewBuildInfo("sidecar"))
	p.c, err = coord.New(coord.Options{
		Settings: s, Leases: leaseClient.CoordinationV1(), Pods: kube.CoreV1(),
		Events: recorder, Metrics: coord.NewMetrics(reg), Logger: log, Token: token,
		LeaseBudget: budget,
	})
	if err != nil {
		p.broadcaster.Shutdown()
		return nil, err
	}

	if p.control, err = listenControl(s.ControlAddr, p.c.ControlHandler(), log, controlTimeouts); err != nil {
		p.broadcaster.Shutdown()
		return nil, fmt.Errorf("control-addr: %w", err)
	}
	if p.probes, err = serve.Listen(s.MetricsAddr, coord.ProbesHandler(reg, p.c.Ready), log, ProbeTimeouts); err != nil {
		p.broadcaster.Shutdown()
		return nil, fmt.Errorf("metrics-addr: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	p.stop = stop
	p.c.Start(ctx)
	log.Info("handoff sidecar started", "identity", s.Identity(), "leases", s.Leases,
		"control", s.ControlAddr.String(), "metrics", s.MetricsAddr, "app", s.AppURL.String(), "version", version.Get(),
		"leaseClientQPS", budget.QPS, "leaseClientBurst", budget.Burst, "leaseCapacity", budget.Leases)
	p.signals = make(chan os.Signal, 2)
	signal.Notify(p.signals, syscall.SIGTERM, syscall.SIGINT)
	return p, nil
}

// kubeconfigError says why the sidecar's kubeconfig (s.Kubeconfig, else
// the in-cluster configuration) could not be loaded: err.
func kubeconfigError(s *config.Settings, err error) error {
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

// secondSignalCancels returns a context that a second signal cancels.
func (p *process) secondSignalCancels() (context.Context, context.CancelFunc) {
	sctx, cancel := context.WithCancel(context.Background())
	go func() { <-p.signals; cancel() }()
	return sctx, cancel
}

// flushEvents waits, up to eventFlush, for the sequence's Events to be
// written; after a sequence a second signal cut short (err, other than
// ErrSidecarRestart), it abandons the Leases instead.
func (p *process) flushEvents(err error) {
	switch {
	case err != nil && !errors.Is(err, coord.ErrSidecarRestart):
		// The app was not told to stop leading: the Leases must expire, not
		// be freed under it.
		p.c.Abandon()
		p.log.Info("shutdown sequence abandoned by a second signal; Leases left to expire")
	case !p.flush.Wait(clock.RealClock{}, eventFlush):
		// Broadcaster.Shutdown cancels the writes under way.
		p.log.Info("exiting with Events not yet written", "waited", eventFlush.String())
	}
}

// waitPhaseWritten waits, up to eventFlush, for the sequence's last phase
// to be written on the pod.
func (p *process) waitPhaseWritten() {
	if !p.c.WaitPhaseWritten(eventFlush) {
		p.log.Info("exiting with the pod's condition "+protocol.PodConditionCoordinating+" not yet written", "waited", eventFlush.String())
	}
}

// shutdownServers shuts the control and probe servers down, each within a
// second.
func (p *process) shutdownServers() {
	for _, srv := range []*http.Server{p.control, p.probes} {
		sc, done := context.WithTimeout(context.Background(), time.Second)
		_ = srv.Shutdown(sc)
		done()
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
