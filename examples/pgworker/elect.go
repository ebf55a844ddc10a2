package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/handoff-dev/handoff/worker"
)

// Client-go's usual timings, which a worker without handoff would use.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// elector holds a Lease in this process with client-go's leader election,
// the way a worker without the handoff sidecar does (--without-handoff):
// the Lease is not released at exit, so a successor waits out its lease
// duration. It is the baseline that handoff is measured against.
type elector struct {
	lock *resourcelock.LeaseLock
	le   *leaderelection.LeaderElector
	log  logr.Logger

	mu    sync.Mutex
	term  context.Context // ends when leadership is lost; nil while not leading
	token int64
}

// newElector returns an elector for lease in namespace (empty: the pod's
// own, from the service account, or the kubeconfig's), with holder identity
// id_<random>. The API client comes from $KUBECONFIG or in-cluster.
func newElector(lease, namespace, id string, log logr.Logger) (*elector, error) {
	kc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), nil)
	cfg, err := kc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("--without-handoff needs the Kubernetes API: %w", err)
	}
	if namespace == "" {
		if namespace, _, err = kc.Namespace(); err != nil {
			return nil, fmt.Errorf("--without-handoff: the namespace of Lease %s: %w", lease, err)
		}
	}
	e := &elector{log: log, lock: &resourcelock.LeaseLock{
		Client:     kubernetes.NewForConfigOrDie(cfg).CoordinationV1(),
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: lease},
		LockConfig: resourcelock.ResourceLockConfig{Identity: id + "_" + string(uuid.NewUUID())},
	}}
	e.le, err = leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          e.lock,
		LeaseDuration: leaseDuration,
		RenewDeadline: renewDeadline,
		RetryPeriod:   retryPeriod,
		Name:          lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: e.started,
			OnStoppedLeading: e.stopped,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("--without-handoff: %w", err)
	}
	return e, nil
}

// run campaigns for the Lease until ctx ends, again after each lost term.
func (e *elector) run(ctx context.Context) {
	for ctx.Err() == nil {
		e.le.Run(ctx)
	}
}

// started records a term; its fencing token is the Lease's leaseTransitions,
// as handoff gives it.
func (e *elector) started(ctx context.Context) {
	rec, _, err := e.lock.Get(ctx)
	if err != nil {
		e.log.Error(err, "read the Lease after acquiring it; no leader job this term", "lease", e.lock.LeaseMeta.Name)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.term, e.token = ctx, int64(rec.LeaderTransitions)
	e.log.Info("leading", "lease", e.lock.LeaseMeta.Name, "fencingToken", e.token, "identity", e.lock.Identity())
}

func (e *elector) stopped() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.term = nil
}

// beginLeading is worker.Agent.BeginLeading for this elector: the context
// ends with ctx or the term; it returns worker.ErrNotLeader when this
// process does not lead.
func (e *elector) beginLeading(ctx context.Context, lease string) (context.Context, worker.Leadership, func(), error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.term == nil || e.term.Err() != nil || !e.le.IsLeader() {
		return nil, worker.Leadership{}, nil, worker.ErrNotLeader
	}
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(e.term, cancel)
	return wctx, worker.Leadership{Lease: lease, FencingToken: e.token}, func() { stop(); cancel() }, nil
}
