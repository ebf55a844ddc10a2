// Command takeover measures Lease handover on a real kube-apiserver and
// etcd (envtest), for handoff's elector and for plain client-go leader
// election with the same timings, in one run:
//
//   - handover latency: from the holder's release write being acknowledged
//     to the standby leading (its own acquiring write acknowledged), and
//     for handoff the same path hop by hop (leaderelection.Config.Trace),
//     beside the floor of the parts measured in the same run: a Lease
//     write's round trip, and a watch's delivery of it (see floor.go);
//   - API requests per Lease per minute made by the holder and by a standby.
//
// Usage: go run ./bench/takeover [-handovers 50] [-pairs 10] [-window 60s] [-protobuf]
// (KUBEBUILDER_ASSETS as for the tests, or built by hack/kube-assets.sh).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	clientgole "k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/handoff-dev/handoff/bench/internal/benchenv"
	"github.com/handoff-dev/handoff/bench/internal/stats"
	"github.com/handoff-dev/handoff/leaderelection"
)

// flags are the command's own: imported libraries register theirs on
// flag.CommandLine (controller-runtime's -kubeconfig), which this command does not read.
var flags = flag.NewFlagSet(os.Args[0], flag.ExitOnError)

var (
	handovers     = flags.Int("handovers", 50, "handovers measured per implementation")
	pairs         = flags.Int("pairs", 10, "Leases handed over concurrently per implementation")
	window        = flags.Duration("window", time.Minute, "how long the API request count runs")
	leaseDuration = flags.Duration("lease-duration", 15*time.Second, "lease duration, both implementations")
	renewDeadline = flags.Duration("renew-deadline", 10*time.Second, "renew deadline, both implementations")
	retryPeriod   = flags.Duration("retry-period", 2*time.Second, "retry period, both implementations")
	protobuf      = flags.Bool("protobuf", false, "Lease requests and watches in protobuf (rest.Config ContentType) rather than client-go's default JSON, both implementations and the floor")
)

const namespace = "bench"

func main() {
	flags.Usage = func() {
		fmt.Fprintf(flags.Output(), "Usage: %s [flags]\n\nStarts its own kube-apiserver and etcd (binaries from KUBEBUILDER_ASSETS, or\nbuilt by hack/kube-assets.sh) and prints handover latency and API requests\nper Lease for handoff and plain client-go.\n\n", os.Args[0])
		flags.PrintDefaults()
	}
	_ = flags.Parse(os.Args[1:])   // ExitOnError
	klog.SetLogger(logr.Discard()) // client-go's own election logs
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "takeover:", err)
		os.Exit(1)
	}
}

func run() error {
	env, stop, err := benchenv.Start()
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	impls := []impl{{"handoff", runHandoff}, {"client-go", runClientGo}}
	fmt.Printf("Lease timings for both: lease duration %s, renew deadline %s, retry period %s\n", *leaseDuration, *renewDeadline, *retryPeriod)
	cfg := rest.CopyConfig(env.Config)
	encoding := "JSON (client-go's default)"
	if *protobuf {
		cfg.ContentType, cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf,application/json"
		encoding = "protobuf"
	}
	fmt.Printf("Lease requests and watches in %s\n\n", encoding)

	fmt.Printf("Handover latency, release acknowledged -> standby leading (%d handovers each, %d Leases at a time)\n", *handovers, *pairs)
	latency := make([][]time.Duration, len(impls))
	hops := make([][]handover, len(impls))
	errs := make([]error, len(impls))
	floorCtx, stopFloor := context.WithCancel(ctx)
	var (
		wg, floorWG sync.WaitGroup
		fl          floor
		floorErr    error
	)
	floorWG.Go(func() { fl, floorErr = measureFloor(floorCtx, cfg) })
	for i, im := range impls {
		wg.Go(func() { hops[i], errs[i] = handoverLatency(cfg, im) })
	}
	wg.Wait()
	stopFloor()
	floorWG.Wait()
	if err := errors.Join(append(errs, floorErr)...); err != nil {
		return err
	}
	for i, im := range impls {
		for _, h := range hops[i] {
			latency[i] = append(latency[i], h.total())
		}
		fmt.Printf("  %-10s %s\n", im.name, stats.Summary(latency[i]))
	}
	printHops(hops[0], fl)
	p50, p99 := ratio(latency[1], latency[0], 50), ratio(latency[1], latency[0], 99)
	fmt.Printf("  handoff is %.0fx faster at p50, %.0fx at p99 (target: handoff p99 <= 5ms, issue 32)\n\n", p50, p99)

	fmt.Printf("API requests per Lease per minute, steady state (one holder, one standby, counted over %s)\n", *window)
	costs := make([]cost, len(impls))
	for i, im := range impls {
		wg.Go(func() { costs[i], errs[i] = apiCost(cfg, im) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	perMin := func(n int) float64 { return float64(n) / window.Minutes() }
	for i, im := range impls {
		c := costs[i]
		fmt.Printf("  %-10s holder %5.1f (%s)   standby %5.1f (%s)\n", im.name, perMin(c.holderN), c.holder, perMin(c.standbyN), c.standby)
	}
	for i, im := range impls {
		fmt.Printf("  %-10s before counting: %s\n", im.name, costs[i].startup)
	}
	return nil
}

func ratio(slow, fast []time.Duration, p float64) float64 {
	f := stats.Percentile(fast, p)
	if f <= 0 {
		return 0
	}
	return float64(stats.Percentile(slow, p)) / float64(f)
}

// impl runs one candidate for a Lease until ctx ends, calling led once when
// it starts leading (after its acquiring write is acknowledged).
type impl struct {
	name string
	run  func(ctx context.Context, leases coordinationv1client.LeasesGetter, lease, identity string, led func(), trace func(leaderelection.Hop))
}

func runHandoff(ctx context.Context, leases coordinationv1client.LeasesGetter, lease, identity string, led func(), trace func(leaderelection.Hop)) {
	var once sync.Once
	e, err := leaderelection.New(leaderelection.Config{
		Leases: leases, Namespace: namespace, Name: lease, Identity: identity,
		LeaseDuration: *leaseDuration, RenewDeadline: *renewDeadline, RetryPeriod: *retryPeriod, Logger: logr.Discard(),
		Trace: trace,
	}, leaderelection.Callbacks{OnTerm: func(leaderelection.Term) { once.Do(led) }})
	if err != nil {
		panic(err) // flags checked by client-go's rules; see leaderelection.New
	}
	e.Run(ctx)
}

func runClientGo(ctx context.Context, leases coordinationv1client.LeasesGetter, lease, identity string, led func(), _ func(leaderelection.Hop)) {
	clientgole.RunOrDie(ctx, clientgole.LeaderElectionConfig{
		Lock: &rl.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: lease},
			Client:     leases,
			LockConfig: rl.ResourceLockConfig{Identity: identity},
		},
		LeaseDuration: *leaseDuration, RenewDeadline: *renewDeadline, RetryPeriod: *retryPeriod,
		ReleaseOnCancel: true,
		Callbacks: clientgole.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { led() },
			OnStoppedLeading: func() {},
		},
	})
}

// candidate is one running contender.
type candidate struct {
	cancel   context.CancelFunc
	done     chan struct{}
	led      chan time.Time // when it started leading
	released chan time.Time // when its release write was acknowledged
	stopAt   time.Time      // when stop was called

	mu  sync.Mutex
	hop [leaderelection.HopAcquireAcked + 1]time.Time // last time at each hop (handoff only)
}

func (c *candidate) trace(h leaderelection.Hop) {
	now := time.Now()
	c.mu.Lock()
	c.hop[h] = now
	c.mu.Unlock()
}

func (c *candidate) at(h leaderelection.Hop) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hop[h]
}

func start(cfg *rest.Config, im impl, lease, identity string, requests *stats.Requests) *candidate {
	c := &candidate{done: make(chan struct{}), led: make(chan time.Time, 1), released: make(chan time.Time, 1)}
	if requests != nil {
		cfg = rest.CopyConfig(cfg)
		cfg.Wrap(requests.Wrap)
	}
	leases := &releaseClock{LeasesGetter: kubernetes.NewForConfigOrDie(cfg).CoordinationV1(), released: c.released}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		im.run(ctx, leases, lease, identity, func() { c.led <- time.Now() }, c.trace)
	}()
	return c
}

func (c *candidate) stop() { c.stopAt = time.Now(); c.cancel(); <-c.done }

// handoverLatency hands each of -pairs Leases back and forth between two
// candidates until -handovers handovers are measured in all.
func handoverLatency(cfg *rest.Config, im impl) ([]handover, error) {
	var (
		mu  sync.Mutex
		out []handover
		wg  sync.WaitGroup
	)
	errs := make([]error, *pairs)
	for p := range *pairs {
		rounds := *handovers / *pairs
		if p < *handovers%*pairs {
			rounds++
		}
		wg.Go(func() {
			d, err := handOver(cfg, im, fmt.Sprintf("%s-%d", im.name, p), rounds)
			mu.Lock()
			out = append(out, d...)
			mu.Unlock()
			errs[p] = err
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

func handOver(cfg *rest.Config, im impl, lease string, rounds int) ([]handover, error) {
	timeout := *leaseDuration + *renewDeadline
	holder := start(cfg, im, lease, lease+"-a", nil)
	defer func() { holder.stop() }()
	select {
	case <-holder.led:
	case <-time.After(timeout):
		return nil, fmt.Errorf("%s: first holder did not lead within %s", lease, timeout)
	}
	var out []handover
	for i := range rounds {
		standby := start(cfg, im, lease, fmt.Sprintf("%s-%d", lease, i), nil)
		// Release at a random point of the standby's polling cycle, once
		// any start-up read is long past.
		time.Sleep(*leaseDuration/3 + rand.N(*retryPeriod*22/10))
		holder.stop()
		var released time.Time
		select {
		case released = <-holder.released:
		default:
			standby.stop()
			return out, fmt.Errorf("%s: the holder did not release the Lease", lease)
		}
		select {
		case led := <-standby.led:
			h := handover{trigger: holder.stopAt, released: released, led: led}
			for p := range h.hop {
				if p <= int(leaderelection.HopReleaseAcked) {
					h.hop[p] = holder.at(leaderelection.Hop(p))
				} else {
					h.hop[p] = standby.at(leaderelection.Hop(p))
				}
			}
			out = append(out, h)
		case <-time.After(timeout):
			standby.stop()
			return out, fmt.Errorf("%s: standby did not lead within %s of the release", lease, timeout)
		}
		holder = standby
	}
	return out, nil
}

// cost is what a holder and a standby sent.
type cost struct {
	holderN, standbyN int
	holder, standby   string
	startup           string
}

// apiCost runs a holder and a standby on one Lease and returns the requests
// each sent during -window once both have settled, and what they sent
// before (acquiring, opening watches).
func apiCost(cfg *rest.Config, im impl) (cost, error) {
	holder, standby := &stats.Requests{}, &stats.Requests{}
	lease := im.name + "-cost"
	h := start(cfg, im, lease, lease+"-holder", holder)
	defer h.stop()
	select {
	case <-h.led:
	case <-time.After(*leaseDuration + *renewDeadline):
		return cost{}, fmt.Errorf("%s: holder did not lead", lease)
	}
	s := start(cfg, im, lease, lease+"-standby", standby)
	defer s.stop()
	time.Sleep(*leaseDuration / 3)
	startup := fmt.Sprintf("holder %s; standby %s", holder.Reset(), standby.Reset())
	time.Sleep(*window)
	return cost{holder.Total(), standby.Total(), holder.String(), standby.String(), startup}, nil
}

// releaseClock notes when an Update that frees the Lease is acknowledged.
type releaseClock struct {
	coordinationv1client.LeasesGetter
	released chan time.Time
}

func (r *releaseClock) Leases(ns string) coordinationv1client.LeaseInterface {
	return &releaseClockClient{LeaseInterface: r.LeasesGetter.Leases(ns), released: r.released}
}

type releaseClockClient struct {
	coordinationv1client.LeaseInterface
	released chan time.Time
}

func (r *releaseClockClient) Update(ctx context.Context, l *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	out, err := r.LeaseInterface.Update(ctx, l, o)
	if err == nil && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "") {
		select {
		case r.released <- time.Now():
		default:
		}
	}
	return out, err
}
