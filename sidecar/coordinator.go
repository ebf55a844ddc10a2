// Package sidecar is the handoff coordinator: it runs the pod's Lease
// elections, tells the app about leadership, and runs the shutdown sequence
// (stop claiming, drain, fallback, revoke, release) once per termination of
// the worker container, however often each is triggered.
//
// The coordinator works in rounds. A round is one set of elections and the
// one sequence that ends them. When a sequence ends in a pod that is not
// being deleted (the kubelet killed the worker container for a restart: a
// liveness or startup probe failure), the coordinator re-arms: once a new
// worker process answers the app API and is not stopping, a new round
// rejoins the elections and tells the new process about leadership, and the
// next preStop runs a new sequence with its own report.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/leaderelection"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

// Phases of the coordinator, as shown in protocol.Status.
const (
	PhaseRunning      = protocol.PhaseRunning
	PhaseShuttingDown = protocol.PhaseShuttingDown
	PhaseRearming     = protocol.PhaseRearming
	PhaseDone         = protocol.PhaseDone
)

// rearmPoll is how often, after a sequence that re-arms, the coordinator
// asks the app whether a new worker process is up.
const rearmPoll = 250 * time.Millisecond

// Options are the Coordinator's dependencies.
type Options struct {
	Settings *config.Settings
	// Leases is the client for Lease traffic; Pods reads the pod's own
	// deletionTimestamp.
	Leases coordinationv1client.LeasesGetter
	Pods   corev1client.PodsGetter
	// Events records Events on the pod; nil records none.
	Events  record.EventRecorder
	Metrics *Metrics
	Logger  logr.Logger
	// Clock times the shutdown sequence (its deadline, budgets, waits and
	// poll pacing); nil is clock.RealClock{}. The Lease terms stay on the
	// elector's wall clock.
	Clock clock.WithTicker
	// Token is the pod's token (protocol.ReadTokenFile of the file named by
	// the token-file setting): every call to the control API must be
	// signed with it, and every call to the app is (protocol.Sign).
	// Required.
	Token string
	// LeaseBudget is the rate budget of the Leases client, for the
	// handoff_lease_* budget metrics and, when it cannot hold every
	// configured Lease, a LeaseBudgetExceeded Event and an error in the log
	// at Start. The zero value reports nothing.
	LeaseBudget leaderelection.Budget
}

// Coordinator runs one pod's elections and its shutdown sequences.
type Coordinator struct {
	s        *config.Settings
	log      logr.Logger
	verifier *protocol.Verifier // of calls to the control API
	app      *protocol.AppClient
	leaseAPI coordinationv1client.LeasesGetter
	pods     *prestop.PodWatch // nil when the pod is unknown
	// podAPI reads the pod's peers, for a successor (findSuccessors); nil
	// when the pod is unknown.
	podAPI corev1client.PodsGetter
	// pick is how a sequence picks the successor; c.mu.
	pick    pickSettings
	phases  *phasePublisher // writes the phase on the pod; nil when the pod is unknown
	events  record.EventRecorder
	pod     *corev1.ObjectReference
	metrics *Metrics
	budget  leaderelection.Budget
	clock   clock.WithTicker
	// peers watches the pods that share the shard set; nil without one.
	peers *peerWatch
	// held writes the shards this pod holds on the pod, for its peers'
	// plans; nil without a shard set or when the pod is unknown.
	held *phasePublisher
	// shardWake asks the current round's shard loop to plan again.
	shardWake chan struct{}
	base      context.Context // ends with Start's context
	endBase   context.CancelFunc
	runs      sync.WaitGroup // election goroutines and pushers of every round
	startOnce sync.Once

	mu      sync.Mutex
	phase   protocol.Phase
	cur     *round           // the round whose elections run, or the next one
	rounds  int              // rounds made so far
	last    *protocol.Report // the last finished sequence's report
	started bool             // Start was called
	closed  bool             // Start's context ended: no election starts any more
}

// round is one set of elections and the sequence that ends them.
type round struct {
	n      int
	leases []*lease
	// shards are the round's shard elections; nil without a shard set.
	shards *shardSet
	armed  bool // elections started; c.mu
	// signalled: SIGTERM to the sidecar joined or started the sequence, so
	// the sidecar is exiting and the round is not re-armed; c.mu.
	signalled bool
	// restarting: SIGTERM in a pod that stays decided that only the sidecar
	// exits (Signal); a later trigger is refused with ErrSidecarRestart, as
	// the exiting process could not finish a sequence; c.mu.
	restarting bool
	// drained is the app instance (DrainStatus.Instance) that drained in
	// the sequence before this round: a re-arm waits for another one.
	drained string

	shutdown chan struct{} // closed when the sequence starts
	done     chan struct{} // closed when the sequence is over
	// successors is the sequence's pick of the pods its releases name.
	successors roundSuccessors
	report     *protocol.Report
}

// lease is one Lease's election in one round and what the app was told of it.
type lease struct {
	elector *leaderelection.Elector
	kind    protocol.LeaseKind // when the sequence hands it over
	// releasedAt is when the sequence released the Lease (a time.Time);
	// unset before.
	releasedAt atomic.Value
	ctx        context.Context    // the election's; ends with the round's sequence
	cancel     context.CancelFunc // ends the election; releases if held
	stopped    chan struct{}      // closed when the election has ended
	wake       chan struct{}      // asks the pusher to tell the app
	// shedding: a shard election being ended while the pod runs (it is
	// no longer assigned to this pod); round.shards.mu.
	shedding bool
	// shed: the shard's election is being ended while the pod runs, so
	// its end is no loss.
	shed atomic.Bool
	// leaving is the round's shutdown: closed when its sequence starts.
	// From then on no new term is granted to the app, only renewals of the
	// one it was granted before.
	leaving <-chan struct{}
	// releaseSent and releaseAcked are when the elector's last release
	// write was sent and when the apiserver acknowledged it, on the
	// coordinator's clock (leaderelection.HopReleaseSent and
	// HopReleaseAcked), for the sequence's hops; unset before.
	releaseSent, releaseAcked atomic.Pointer[time.Time]
	// named is the successor the last release write named ("" for none);
	// unset before a release write.
	named atomic.Pointer[string]

	// mu serialises leadership calls to the app, so a revoke is never
	// overtaken by an older grant.
	mu      sync.Mutex
	revoked bool      // shutdown revoked leadership: no grant after this
	granted time.Time // the Until last sent to the app; zero when none
	token   int64     // the fencing token of the term last granted
	seq     int64     // protocol.Leadership.Sequence of the last message
}

// nextSequence numbers the next message to the app; l.mu is held. The
// numbers are wall-clock nanoseconds, kept strictly increasing, so that a
// restarted sidecar container, or a later round, continues above its
// predecessor's.
func (l *lease) nextSequence() int64 {
	l.seq = max(l.seq+1, time.Now().UnixNano())
	return l.seq
}

// New returns a Coordinator for o.Settings; Start runs it. Shutdown may be
// called at any time, before Start too.
//
// It returns an error when o.Token is not a token (protocol.CheckToken).
func New(o Options) (*Coordinator, error) {
	if err := protocol.CheckToken(o.Token); err != nil {
		return nil, fmt.Errorf("sidecar: the pod's token (setting token-file, %s): %w", protocol.TokenFileEnv, err)
	}
	s := o.Settings
	c := &Coordinator{
		s:        s,
		log:      o.Logger,
		verifier: protocol.NewVerifier(o.Token, nil),
		app:      protocol.NewAppClient(s.AppURL, o.Token),
		leaseAPI: o.Leases,
		events:   o.Events,
		metrics:  o.Metrics,
		budget:   o.LeaseBudget,
		clock:    o.Clock,
		phase:    PhaseRunning,
		pick:     pickSettings{resourceVersion: pickResourceVersion, wait: pickWait},
		pod: &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1",
			Namespace: s.PodNamespace, Name: s.PodName, UID: types.UID(s.PodUID)},
	}
	if c.clock == nil {
		c.clock = clock.RealClock{}
	}
	if o.Pods != nil && s.PodName != "" {
		c.pods = prestop.NewPodWatch(o.Pods, s.PodNamespace, s.PodName)
		c.podAPI = o.Pods
		c.phases = newPhasePublisher(o.Pods.Pods(s.PodNamespace), s.PodName, c.clock, c.log)
	}
	if s.DeletionCost && c.pods == nil {
		return nil, errors.New("sidecar: setting deletion-cost needs the pod (setting pod-name) and the Pods client, to write the pod's deletion cost")
	}
	if len(s.Shards) > 0 {
		if o.Pods == nil {
			return nil, errors.New("sidecar: a shard set needs the Pods client, to watch its peers (setting shard-peers)")
		}
		c.peers = newPeerWatch(o.Pods, s.PodNamespace, s.ShardPeers)
		c.shardWake = make(chan struct{}, 1)
		if s.PodName != "" {
			c.held = newPhasePublisher(o.Pods.Pods(s.PodNamespace), s.PodName, c.clock, c.log)
		}
	}
	c.metrics.exportLeases(s)
	c.base, c.endBase = context.WithCancel(context.Background())
	r, err := c.newRound()
	if err != nil {
		return nil, err
	}
	c.cur = r
	return c, nil
}

// newRound makes the electors of a new round; it runs nothing.
func (c *Coordinator) newRound() (*round, error) {
	c.rounds++
	r := &round{n: c.rounds, shutdown: make(chan struct{}), done: make(chan struct{})}
	for _, name := range c.s.Leases {
		kind := protocol.LeaseKindPartition
		if c.s.IsRole(name) {
			kind = protocol.LeaseKindRole
		}
		l, err := c.newLease(r, name, kind)
		if err != nil {
			return nil, err
		}
		r.leases = append(r.leases, l)
	}
	if c.peers != nil {
		r.shards = &shardSet{active: map[string]*lease{}}
		if len(c.s.Shards) > 0 {
			// The timings are checked once here, not at each shard's start.
			if _, err := c.newLease(r, c.s.Shards[0], protocol.LeaseKindPartition); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

// newLease makes the election of one Lease in round r; it runs nothing.
func (c *Coordinator) newLease(r *round, name string, kind protocol.LeaseKind) (*lease, error) {
	l := &lease{stopped: make(chan struct{}), wake: make(chan struct{}, 1), leaving: r.shutdown, kind: kind}
	l.ctx, l.cancel = context.WithCancel(c.base)
	e, err := leaderelection.New(leaderelection.Config{
		Leases: c.leaseAPI, Namespace: c.s.PodNamespace, Name: name, Identity: c.s.Identity(),
		LeaseDuration: c.s.LeaseDuration, RenewDeadline: c.s.RenewDeadline, RetryPeriod: c.s.RetryPeriod,
		Logger: c.log.WithValues("lease", name),
		Successor: func() string {
			n := r.successors.of(name)
			l.named.Store(&n)
			return n
		},
		Trace: func(h leaderelection.Hop) {
			switch h {
			case leaderelection.HopReleaseSent:
				now := c.clock.Now()
				l.releaseSent.Store(&now)
			case leaderelection.HopReleaseAcked:
				now := c.clock.Now()
				l.releaseAcked.Store(&now)
			}
		},
	}, c.callbacks(r, name, l))
	if err != nil {
		l.cancel()
		return nil, err
	}
	l.elector = e
	return l, nil
}

// runLease runs l's election and its pushes to the app.
func (c *Coordinator) runLease(l *lease) {
	c.runs.Add(2)
	go func() {
		defer c.runs.Done()
		defer close(l.stopped)
		l.elector.Run(l.ctx)
	}()
	go func() {
		defer c.runs.Done()
		c.pushLeadership(l)
	}()
}

// Start runs the elections and the leadership pushes to the app until ctx
// ends or a shutdown sequence stops them (and again after each re-arm). It
// does not block; Wait waits for the elections to end.
func (c *Coordinator) Start(ctx context.Context) {
	c.startOnce.Do(func() {
		context.AfterFunc(ctx, c.endBase)
		c.mu.Lock()
		c.started = true
		r := c.cur
		c.mu.Unlock()
		if c.pods != nil {
			c.pods.OnDeletion(c.onDeletion)
			go c.pods.Run(c.base)
		}
		if c.phases != nil {
			go c.phases.run(c.base)
		}
		if c.s.DeletionCost {
			go c.keepDeletionCost(c.base)
		}
		if c.peers != nil {
			go c.peers.informer.RunWithContext(c.base)
		}
		if c.held != nil {
			go c.held.run(c.base)
		}
		c.reportBudget()
		c.arm(r)
	})
}

// reportBudget sets the budget metrics and says, once at start, when the
// Leases client's budget cannot keep every configured Lease renewed.
func (c *Coordinator) reportBudget() {
	b := c.budget
	if b.RetryPeriod == 0 {
		return
	}
	c.metrics.LeasesConfigured.Set(float64(b.Want))
	c.metrics.LeaseCapacity.Set(float64(b.Leases))
	c.metrics.LeaseClientRateLimit.Set(float64(b.QPS))
	if msg := b.Shortfall(); msg != "" {
		c.log.Error(nil, "Lease client budget too small for the configured Leases: "+msg,
			"leases", b.Want, "capacity", b.Leases, "qps", b.QPS)
		c.event(corev1.EventTypeWarning, ReasonLeaseBudgetExceeded, "%s", strings.ToUpper(msg[:1])+msg[1:])
	}
}

// onDeletion starts the sequence at the pod's deletion, seen by the watch
// of the pod's own object (prestop.PodWatch.OnDeletion), rather than at the
// kubelet's preStop about 0.1 s later: the hook joins it, as any trigger
// joins a sequence under way, and gets its report. The deadline is the
// same, from the deletionTimestamp.
func (c *Coordinator) onDeletion(pod *corev1.Pod) {
	if c.s.PodUID != "" && string(pod.UID) != c.s.PodUID {
		return // another pod of the same name
	}
	at := c.clock.Now()
	c.log.Info("pod deletion seen: the shutdown sequence starts before the preStop hook", "deletionTimestamp", pod.DeletionTimestamp)
	go func() { _, _ = c.shutdownAt(c.base, TriggerDeletion, at) }()
}

// arm starts r's elections, unless its sequence has started, it is already
// armed, or Start's context has ended. It reports whether it armed r.
func (c *Coordinator) arm(r *round) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.armed || c.closed || c.base.Err() != nil || isClosed(r.shutdown) {
		return false
	}
	r.armed = true
	if c.cur == r {
		c.setPhase(PhaseRunning, "its elections run: a preStop hands the pod's Leases over")
	}
	for _, l := range r.leases {
		c.runLease(l)
	}
	if r.shards != nil {
		c.runs.Add(1)
		go func() {
			defer c.runs.Done()
			c.runShards(r)
		}()
	}
	c.metrics.Coordinating.Set(1)
	return true
}

// Wait blocks until the context passed to Start has ended and every
// election of every round has ended (and released its Lease, if held).
func (c *Coordinator) Wait() {
	<-c.base.Done()
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.runs.Wait()
}

// Abandon makes every election of the current round leave its Lease to
// expire rather than release it, for an exit that skips the leadership
// revoke.
func (c *Coordinator) Abandon() {
	c.mu.Lock()
	r := c.cur
	c.mu.Unlock()
	for _, l := range append(slices.Clone(r.leases), r.activeShards()...) {
		l.elector.WithholdRelease()
	}
}

// Done is closed when the current round's shutdown sequence is over.
func (c *Coordinator) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur.done
}

// setPhase enters phase, which message explains, and has it written on
// the pod (phasePublisher); c.mu is held.
func (c *Coordinator) setPhase(phase protocol.Phase, message string) {
	c.phase = phase
	if c.phases != nil {
		c.phases.set(phase, message)
	}
}

// ControllerKind is the kind of the pod's controller (its owner reference
// marked controller, like ReplicaSet or StatefulSet), from the watch of the
// pod (a GET bounded by podReadTimeout if the watch has not seen it); ""
// when it has none or the pod cannot be read.
func (c *Coordinator) ControllerKind() string {
	if c.pods == nil {
		return ""
	}
	p, _, err := c.pods.Pod(context.Background(), podReadTimeout)
	if err != nil || p == nil {
		return ""
	}
	if ref := metav1.GetControllerOf(p); ref != nil {
		return ref.Kind
	}
	return ""
}

// WaitPhaseWritten waits up to d for the current phase to be written on
// the pod's status (protocol.PodConditionCoordinating), and reports whether
// it was; true at once when the pod is unknown.
func (c *Coordinator) WaitPhaseWritten(d time.Duration) bool {
	if c.phases == nil {
		return true
	}
	return c.phases.wait(d)
}

// Ready is nil when the coordinator can coordinate: its elections run and a
// preStop would start a sequence that hands over. Otherwise it says why:
// a sequence under way, or over and not re-armed (elections stopped).
func (c *Coordinator) Ready() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.started:
		return errors.New("not started")
	case c.phase != PhaseRunning || !c.cur.armed:
		return fmt.Errorf("not coordinating: phase %s, elections stopped", c.phase)
	}
	return nil
}

// Status is the coordinator's current state; Report is the last
// sequence's, once one is over.
func (c *Coordinator) Status() protocol.Status {
	c.mu.Lock()
	st := protocol.Status{Identity: c.s.Identity(), Phase: c.phase, Leases: []protocol.LeaseStatus{}}
	r := c.cur
	st.Report = c.last
	c.mu.Unlock()
	for _, l := range append(slices.Clone(r.leases), r.activeShards()...) {
		ls := protocol.LeaseStatus{Lease: l.elector.Name(), Kind: l.kind, HolderIdentity: l.elector.Holder()}
		if at, ok := l.releasedAt.Load().(time.Time); ok {
			ls.ReleasedAt = at
		}
		if t, ok := l.elector.Term(); ok {
			ls.Leader, ls.FencingToken, ls.Until = true, t.FencingToken, t.Until
		}
		st.Leases = append(st.Leases, ls)
	}
	return st
}

func (c *Coordinator) callbacks(r *round, name string, l *lease) leaderelection.Callbacks {
	leading := false // only touched from the election goroutine
	return leaderelection.Callbacks{
		OnTerm: func(t leaderelection.Term) {
			if !leading {
				leading = true
				c.metrics.Leader.WithLabelValues(name, string(l.kind)).Set(1)
				c.metrics.Acquisitions.WithLabelValues(name).Inc()
				c.log.Info("lease acquired", "lease", name, "fencingToken", t.FencingToken, "round", r.n)
				c.event(corev1.EventTypeNormal, ReasonLeaseAcquired, "Lease %s acquired by %s, fencing token %d", name, c.s.Identity(), t.FencingToken)
				if c.shardWake != nil {
					poke(c.shardWake)
				}
			}
			poke(l.wake)
		},
		OnStopped: func() {
			leading = false
			c.metrics.Leader.WithLabelValues(name, string(l.kind)).Set(0)
			if isClosed(r.shutdown) {
				// A leaving pod that lost (or released) a Lease must not
				// compete for it again: the election ends here, before
				// the elector's loop could run another standby phase.
				l.cancel()
			} else if c.base.Err() == nil && !l.shed.Load() {
				c.log.Info("lease lost", "lease", name)
				c.event(corev1.EventTypeWarning, ReasonLeaseLost, "Lease %s lost: not renewed within the renew deadline %s", name, c.s.RenewDeadline)
			}
			if c.shardWake != nil {
				poke(c.shardWake)
			}
			poke(l.wake)
		},
	}
}

// pushLeadership tells the app each change and renewal of l's term, until
// l's election has ended. It also tells the app its term is over at the end
// of the term it was granted (the Until last sent), when no renewal moved
// it: client-go reports a lost Lease only after its renew deadline and a
// release attempt, which can be after another candidate took the Lease.
func (c *Coordinator) pushLeadership(l *lease) {
	end := time.NewTimer(time.Hour)
	end.Stop()
	defer end.Stop()
	for {
		select {
		case <-l.wake:
		case <-end.C:
		case <-l.stopped:
			return
		}
		l.mu.Lock()
		if !l.revoked {
			c.tellApp(l)
		}
		granted := l.granted
		l.mu.Unlock()
		end.Stop()
		if !granted.IsZero() {
			// Fires at the end of the term, or at once to retry a revoke
			// that was not delivered.
			end.Reset(max(time.Until(granted), minStep))
		}
	}
}

// tellApp sends the current term, or its end, to the app; l.mu is held.
func (c *Coordinator) tellApp(l *lease) {
	msg := protocol.Leadership{Lease: l.elector.Name(), HolderIdentity: l.elector.Holder()}
	t, leader := l.elector.Term()
	if !leader && l.granted.IsZero() {
		return
	}
	if leader && isClosed(l.leaving) && (l.granted.IsZero() || t.FencingToken != l.token) {
		// The app is stopping: a term it was not granted before the
		// sequence started never reaches it.
		return
	}
	msg.Sequence = l.nextSequence()
	first := leader && (l.granted.IsZero() || t.FencingToken != l.token)
	if leader {
		msg.Leader, msg.FencingToken, msg.Until = true, t.FencingToken, t.Until
		msg.ValidForMillis = time.Until(t.Until).Milliseconds()
		// Counted as granted before the call: the app may act on a grant
		// whose answer was lost.
		l.granted, l.token = t.Until, t.FencingToken
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(c.s.RetryPeriod, time.Second))
	defer cancel()
	asked := c.clock.Now()
	err := c.app.SetLeadership(ctx, msg)
	c.metrics.appResult("leadership", c.clock.Since(asked), err)
	switch {
	case !leader && protocol.IsAppGone(err):
		// No process holds the term any more.
		l.granted = time.Time{}
	case err != nil:
		c.log.V(1).Info("telling the app about leadership failed", "lease", msg.Lease, "leader", msg.Leader, "error", err.Error())
	case !leader:
		l.granted = time.Time{}
	case first:
		// The last hop of a handover: the app knows it leads (its "told" time, for the figures).
		c.log.Info("app told it leads", "lease", msg.Lease, "fencingToken", msg.FencingToken, "told", c.clock.Now().Format(time.RFC3339Nano), "took", c.clock.Since(asked).String())
	}
}

// rearm waits for a new worker process (one that answers the app API and is
// not stopping) and then starts r's elections. It gives up when Start's
// context ends or a trigger starts r's sequence first.
func (c *Coordinator) rearm(r *round) {
	c.log.Info("waiting for a new worker process to rejoin the elections", "round", r.n)
	t := time.NewTicker(rearmPoll)
	defer t.Stop()
	for {
		select {
		case <-c.base.Done():
			return
		case <-r.shutdown:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.base, time.Second)
		st, err := c.app.Drain(ctx, 0)
		cancel()
		if err != nil || st.Stopping || (st.Instance != "" && st.Instance == r.drained) {
			// Not a new process: the old one is still up until the kubelet
			// kills it (it says not stopping when stop-claiming failed).
			continue
		}
		// A Lease the last round left held (its release withheld: the old
		// process never confirmed its leader work stopped) is freed now that
		// that process is gone, so the new process's term comes with a new
		// transition and a greater fencing token, never the old one's.
		c.releaseLeftovers()
		if c.arm(r) {
			c.log.Info("re-armed: a new worker process is up; rejoining the elections", "round", r.n, "leases", c.s.Leases)
			c.metrics.Rearms.Inc()
			c.event(corev1.EventTypeNormal, ReasonRearmed, "Worker restarted: rejoined the elections for %v", c.s.Leases)
		}
		return
	}
}

// releaseLeftovers frees every configured Lease that still names this pod
// (leaderelection.ReleaseLeftover), each request bounded as the elector's.
func (c *Coordinator) releaseLeftovers() {
	for _, name := range append(slices.Clone(c.s.Leases), c.s.Shards...) {
		released, err := c.releaseLeftover(c.base, name)
		switch {
		case err != nil:
			c.log.Info("a Lease left held by the last worker process was not released: it expires", "lease", name, "error", err.Error())
		case released:
			c.log.Info("released a Lease left held by the last worker process", "lease", name)
		}
	}
}

// releaseLeftover frees Lease name if it still names this pod
// (leaderelection.ReleaseLeftover), each request bounded as the elector's
// and the whole within two of them, or until ctx ends.
func (c *Coordinator) releaseLeftover(ctx context.Context, name string) (bool, error) {
	freed, _, err := c.releaseLeftoverRead(ctx, name)
	return freed, err
}

// releaseLeftoverRead is releaseLeftover, and also reports whether it read
// the Lease free (leaderelection.ReleaseLeftoverRead).
func (c *Coordinator) releaseLeftoverRead(ctx context.Context, name string) (freed, free bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*leaderelection.RequestTimeout(c.s.RenewDeadline))
	defer cancel()
	return leaderelection.ReleaseLeftoverRead(ctx, c.leaseAPI, c.s.PodNamespace, name, c.s.Identity(), leaderelection.RequestTimeout(c.s.RenewDeadline))
}

func (c *Coordinator) event(eventtype, reason, format string, args ...any) {
	if c.events != nil {
		c.events.Eventf(c.pod, eventtype, reason, format, args...)
	}
}

// poke wakes a goroutine waiting on ch without blocking.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
