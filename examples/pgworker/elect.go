package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"

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

// newElector returns an elector for the Lease namespace/lease through
// leases, with holder identity id_<random UUID>.
func newElector(leases coordinationv1client.LeasesGetter, namespace, lease, id string, log logr.Logger) (*elector, error) {
	e := &elector{log: log, lock: &resourcelock.LeaseLock{
		Client:     leases,
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: lease},
		LockConfig: resourcelock.ResourceLockConfig{Identity: id + "_" + string(uuid.NewUUID())},
	}}
	var err error
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

// leasesClient returns a Leases client from $KUBECONFIG, or in-cluster, and
// the namespace to use: the kubeconfig context's, or the pod's own.
func leasesClient() (coordinationv1client.LeasesGetter, string, error) {
	// clientcmd ignores a $KUBECONFIG whose files are all missing, and then
	// blames KUBERNETES_MASTER: name the file instead.
	if env := os.Getenv("KUBECONFIG"); env != "" && !slices.ContainsFunc(filepath.SplitList(env), exists) {
		return nil, "", fmt.Errorf("--without-handoff: KUBECONFIG=%s: no such file", env)
	}
	kc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), nil)
	cfg, err := kc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("--without-handoff needs the Kubernetes API ($KUBECONFIG, or in-cluster): %w", err)
	}
	namespace, _, err := kc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("--without-handoff: the namespace of the Lease: %w", err)
	}
	client, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("--without-handoff: %w", err)
	}
	return client, namespace, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// run campaigns for the Lease until ctx ends, again after each lost term.
func (e *elector) run(ctx context.Context) {
	for ctx.Err() == nil {
		e.le.Run(ctx)
	}
}

// started records a term; its fencing token is the Lease's leaseTransitions,
// as handoff gives it. It reads the Lease itself: the lock is the elector's.
func (e *elector) started(ctx context.Context) {
	meta := e.lock.LeaseMeta
	l, err := e.lock.Client.Leases(meta.Namespace).Get(ctx, meta.Name, metav1.GetOptions{})
	if err == nil && ptr.Deref(l.Spec.HolderIdentity, "") != e.lock.Identity() {
		err = fmt.Errorf("held by %q already", ptr.Deref(l.Spec.HolderIdentity, ""))
	}
	if err != nil {
		e.log.Error(err, "read the Lease after acquiring it; no leader job this term", "lease", meta.Name)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.term, e.token = ctx, int64(ptr.Deref(l.Spec.LeaseTransitions, 0))
	e.log.Info("leading", "lease", meta.Name, "fencingToken", e.token, "identity", e.lock.Identity())
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
