// Package sidecar is the handoff coordinator: it runs the pod's Lease
// elections, tells the app about leadership, and runs the shutdown sequence
// (stop claiming, drain, fallback, revoke, release) once, however often it is
// triggered.
package sidecar

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/leaderelection"
	"github.com/handoff-dev/handoff/protocol"
)

// Phases of the coordinator, as shown in protocol.Status.
const (
	PhaseRunning      = "Running"
	PhaseShuttingDown = "ShuttingDown"
	PhaseDone         = "Done"
)

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
}

// Coordinator runs one pod's elections and its shutdown sequence.
type Coordinator struct {
	s       *config.Settings
	log     logr.Logger
	app     *AppClient
	pods    corev1client.PodsGetter
	events  record.EventRecorder
	pod     *corev1.ObjectReference
	metrics *Metrics
	leases  []*lease

	ctx      context.Context // Start's
	once     sync.Once
	mu       sync.Mutex
	phase    string
	report   *protocol.Report
	shutdown chan struct{} // closed when the sequence starts
	done     chan struct{} // closed when the sequence is over
}

// lease is one Lease's election and what the app was told of it.
type lease struct {
	elector *leaderelection.Elector
	cancel  context.CancelFunc // ends the election; releases if held
	stopped chan struct{}      // closed when the election has ended
	wake    chan struct{}      // asks the pusher to tell the app

	// mu serialises leadership calls to the app, so a revoke is never
	// overtaken by an older grant.
	mu      sync.Mutex
	revoked bool      // shutdown revoked leadership: no grant after this
	granted time.Time // the Until last sent to the app; zero when none
	seq     int64     // protocol.Leadership.Sequence of the last message
}

// nextSequence numbers the next message to the app; l.mu is held. The
// numbers are wall-clock nanoseconds, kept strictly increasing, so that a
// restarted sidecar container continues above its predecessor's.
func (l *lease) nextSequence() int64 {
	l.seq = max(l.seq+1, time.Now().UnixNano())
	return l.seq
}

// New returns a Coordinator for o.Settings; Start runs it.
func New(o Options) (*Coordinator, error) {
	s := o.Settings
	c := &Coordinator{
		s:       s,
		log:     o.Logger,
		app:     NewAppClient(s.AppURL),
		pods:    o.Pods,
		events:  o.Events,
		metrics: o.Metrics,
		phase:   PhaseRunning,
		pod: &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1",
			Namespace: s.PodNamespace, Name: s.PodName, UID: types.UID(s.PodUID)},
		shutdown: make(chan struct{}),
		done:     make(chan struct{}),
	}
	for _, name := range s.Leases {
		l := &lease{stopped: make(chan struct{}), wake: make(chan struct{}, 1)}
		e, err := leaderelection.New(leaderelection.Config{
			Leases: o.Leases, Namespace: s.PodNamespace, Name: name, Identity: s.Identity(),
			LeaseDuration: s.LeaseDuration, RenewDeadline: s.RenewDeadline, RetryPeriod: s.RetryPeriod,
			Logger: o.Logger.WithValues("lease", name),
		}, c.callbacks(name, l))
		if err != nil {
			return nil, err
		}
		l.elector = e
		c.leases = append(c.leases, l)
	}
	return c, nil
}

// Start runs the elections and the leadership pushes to the app until ctx
// ends or the shutdown sequence stops them. It does not block; Wait waits
// for the elections to end.
func (c *Coordinator) Start(ctx context.Context) {
	c.ctx = ctx
	for _, l := range c.leases {
		ectx, cancel := context.WithCancel(ctx)
		l.cancel = cancel
		go func() {
			defer close(l.stopped)
			l.elector.Run(ectx)
		}()
		go c.pushLeadership(ctx, l)
	}
}

// Wait blocks until every election has ended (and released its Lease, if
// held), after ctx passed to Start ends or the sequence is over.
func (c *Coordinator) Wait() {
	for _, l := range c.leases {
		<-l.stopped
	}
}

// Abandon makes every election leave its Lease to expire rather than
// release it, for an exit that skips the leadership revoke.
func (c *Coordinator) Abandon() {
	for _, l := range c.leases {
		l.elector.WithholdRelease()
	}
}

// Done is closed when the shutdown sequence is over.
func (c *Coordinator) Done() <-chan struct{} { return c.done }

// Status is the coordinator's current state.
func (c *Coordinator) Status() protocol.Status {
	c.mu.Lock()
	st := protocol.Status{Identity: c.s.Identity(), Phase: c.phase, Report: c.report, Leases: []protocol.LeaseStatus{}}
	c.mu.Unlock()
	for _, l := range c.leases {
		ls := protocol.LeaseStatus{Lease: l.elector.Name(), HolderIdentity: l.elector.Holder()}
		if t, ok := l.elector.Term(); ok {
			ls.Leader, ls.FencingToken, ls.Until = true, t.FencingToken, t.Until
		}
		st.Leases = append(st.Leases, ls)
	}
	return st
}

func (c *Coordinator) callbacks(name string, l *lease) leaderelection.Callbacks {
	leading := false // only touched from the election goroutine
	return leaderelection.Callbacks{
		OnTerm: func(t leaderelection.Term) {
			if !leading {
				leading = true
				c.metrics.Leader.WithLabelValues(name).Set(1)
				c.metrics.Acquisitions.WithLabelValues(name).Inc()
				c.log.Info("lease acquired", "lease", name, "fencingToken", t.FencingToken)
				c.event(corev1.EventTypeNormal, ReasonLeaseAcquired, "Lease %s acquired by %s, fencing token %d", name, c.s.Identity(), t.FencingToken)
			}
			poke(l.wake)
		},
		OnStopped: func() {
			leading = false
			c.metrics.Leader.WithLabelValues(name).Set(0)
			select {
			case <-c.shutdown:
			case <-c.ctx.Done():
			default:
				c.log.Info("lease lost", "lease", name)
				c.event(corev1.EventTypeWarning, ReasonLeaseLost, "Lease %s lost: not renewed within the renew deadline %s", name, c.s.RenewDeadline)
			}
			poke(l.wake)
		},
	}
}

// pushLeadership tells the app each change and renewal of l's term.
func (c *Coordinator) pushLeadership(ctx context.Context, l *lease) {
	for {
		select {
		case <-l.wake:
		case <-ctx.Done():
			return
		}
		l.mu.Lock()
		if !l.revoked {
			c.tellApp(ctx, l)
		}
		l.mu.Unlock()
	}
}

// tellApp sends the current term, or its end, to the app; l.mu is held.
func (c *Coordinator) tellApp(ctx context.Context, l *lease) {
	msg := protocol.Leadership{Lease: l.elector.Name(), HolderIdentity: l.elector.Holder()}
	t, leader := l.elector.Term()
	if !leader && l.granted.IsZero() {
		return
	}
	msg.Sequence = l.nextSequence()
	if leader {
		msg.Leader, msg.FencingToken, msg.Until = true, t.FencingToken, t.Until
		msg.ValidForMillis = time.Until(t.Until).Milliseconds()
		// Counted as granted before the call: the app may act on a grant
		// whose answer was lost.
		l.granted = t.Until
	}
	ctx, cancel := context.WithTimeout(ctx, min(c.s.RetryPeriod, time.Second))
	defer cancel()
	err := c.app.SetLeadership(ctx, msg)
	c.metrics.appResult("leadership", err)
	switch {
	case err != nil:
		c.log.V(1).Info("telling the app about leadership failed", "lease", msg.Lease, "leader", msg.Leader, "error", err.Error())
	case !leader:
		l.granted = time.Time{}
	}
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
