package outcomes

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/handoff-dev/handoff/internal/outcome"
)

// DefaultWindow is how far before its start a new leader counts Events
// from (Runner.Window).
const DefaultWindow = 30 * time.Second

// The outcome Lease's timings: client-go's and controller-runtime's
// defaults.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// FieldSelector selects the Events the counter reads, on the API server:
// the sidecars' ShutdownFinished Events.
var FieldSelector = fields.AndSelectors(
	fields.OneTermEqualSelector("source", Source),
	fields.OneTermEqualSelector("reason", outcome.Reason),
).String()

// Runner is the outcome counter in a webhook replica: a controller-runtime
// Runnable that runs on every replica, campaigns for the outcome Lease
// (client-go leader election, released on exit) and, while it holds it,
// counts the ShutdownFinished Events of every namespace (Counter) from an
// informer. A replica that loses the Lease stops counting and campaigns
// again; the webhook's admission serving never depends on it.
type Runner struct {
	// Client reads the Events and holds the Lease.
	Client kubernetes.Interface
	// Namespace and Lease name the outcome Lease.
	Namespace, Lease string
	// Identity is this replica's holder identity; empty: the hostname and
	// a random suffix.
	Identity string
	// Window is how far before its start a new leader counts Events from
	// (0: DefaultWindow): the Events written while no replica led (a
	// failover) are counted if they are that recent, and those the last
	// leader counted in that window are counted again.
	Window time.Duration
	// Dedupe is the Counter's memory, in Events (0: DefaultDedupe).
	Dedupe  int
	Metrics *Metrics
	Log     logr.Logger
	// counting, if set, is called with each Counter as its leader starts
	// (tests).
	counting func(*Counter)
	// active counts the terms whose counting runs.
	active atomic.Int32
}

// NeedLeaderElection is false: the Runner elects on its own, so that a
// lost outcome Lease stops the counting alone, not the webhook (the
// manager's leader election exits the process when its Lease is lost).
func (r *Runner) NeedLeaderElection() bool { return false }

// Start campaigns and counts until ctx ends; it returns nil then, or an
// error if the Lease cannot be campaigned for at all.
func (r *Runner) Start(ctx context.Context) error {
	id := r.Identity
	if id == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("outcome counter: holder identity: %w", err)
		}
		id = host + "_" + string(uuid.NewUUID())
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Lease},
		Client:     r.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
			ReleaseOnCancel: true, Name: "handoff-outcomes",
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					// A term's counting may still be ending when the next
					// begins (the Lease lost and won back at once).
					r.active.Add(1)
					r.Metrics.Leader.Set(1)
					defer func() {
						if r.active.Add(-1) == 0 {
							r.Metrics.Leader.Set(0)
						}
					}()
					r.Log.Info("counting handover outcomes: this replica leads", "lease", r.Namespace+"/"+r.Lease, "identity", id)
					if err := r.count(lctx); err != nil {
						r.Log.Error(err, "counting handover outcomes")
					}
				},
				OnStoppedLeading: func() {
					r.Log.Info("not counting handover outcomes: this replica no longer leads", "lease", r.Namespace+"/"+r.Lease)
				},
			},
		})
		if err != nil {
			return fmt.Errorf("outcome counter: %w", err)
		}
		le.Run(ctx)
	}
	return nil
}

// count runs a Counter from an informer of the ShutdownFinished Events of
// every namespace until ctx ends.
func (r *Runner) count(ctx context.Context) error {
	window := r.Window
	if window <= 0 {
		window = DefaultWindow
	}
	c := NewCounter(r.Metrics, time.Now().Add(-window), r.Dedupe, r.Log)
	if r.counting != nil {
		r.counting(c)
	}
	events := r.Client.CoreV1().Events(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = FieldSelector
			return events.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = FieldSelector
			return events.Watch(ctx, o)
		},
	}
	// As client-go's generated informers: a client that cannot stream its
	// initial list (the fake clientset) lists.
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, r.Client), &corev1.Event{}, 0, cache.Indexers{})
	// The informer's store holds what the counter reads, no more.
	if err := inf.SetTransform(slim); err != nil {
		return err
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if e, ok := obj.(*corev1.Event); ok {
				c.Observe(nil, e)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Event)
			e, ok2 := newObj.(*corev1.Event)
			if ok1 && ok2 {
				c.Observe(o, e)
			}
		},
	}); err != nil {
		return err
	}
	inf.RunWithContext(ctx)
	return nil
}

// slim keeps of an Event what the counter reads.
func slim(obj any) (any, error) {
	e, ok := obj.(*corev1.Event)
	if !ok {
		return obj, nil
	}
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name: e.Name, Namespace: e.Namespace, UID: e.UID, ResourceVersion: e.ResourceVersion,
			CreationTimestamp: e.CreationTimestamp,
			Annotations:       map[string]string{outcome.Annotation: e.Annotations[outcome.Annotation]},
		},
		InvolvedObject: corev1.ObjectReference{Kind: e.InvolvedObject.Kind, Name: e.InvolvedObject.Name},
		Reason:         e.Reason, Source: corev1.EventSource{Component: e.Source.Component},
		Count: e.Count, FirstTimestamp: e.FirstTimestamp, LastTimestamp: e.LastTimestamp, EventTime: e.EventTime,
	}, nil
}
