//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// recorder keeps what two informers saw of one Deployment's pods and its
// Lease, each stamped with the time this process received it.
type recorder struct {
	mu      sync.Mutex
	holders []holderSeen
	pods    map[string]*podSeen
}

// holderSeen is one observation of the Lease: every update, not only the
// changes of holder.
type holderSeen struct {
	at     time.Time
	holder string // holder identity, "" when free
	// renewed is the Lease's renewTime and duration its leaseDurationSeconds:
	// no one else may take it before renewed + duration.
	renewed  time.Time
	duration time.Duration
}

// podSeen is one pod's life as observed.
type podSeen struct {
	name        string
	terminating time.Time // deletionTimestamp first seen set
	// deleteSent: when the test sent the pod's delete request itself
	// (recorder.deleting), zero otherwise.
	deleteSent time.Time
	deadline   time.Time // the pod's deletionTimestamp (whole seconds)
	gone       time.Time // the delete seen
	// stopped: a status seen, while terminating, with every container
	// terminated (the native sidecar too): the kubelet's report, before its
	// cleanup of the pod (volumes, the pod's cgroup at its housekeeping,
	// every 2 s) and the deletion of the object. Zero if never seen.
	stopped time.Time
}

// start is the pod's termination start: when the test sent its delete
// request, for a pod the test deletes (the deletion is between that and the
// answer; the watch event comes later by the watch's delivery), else when
// its deletionTimestamp was seen.
func (s *podSeen) start() time.Time {
	if !s.deleteSent.IsZero() && s.deleteSent.Before(s.terminating) {
		return s.deleteSent
	}
	return s.terminating
}

// deleting records that the test sends pod's delete request now.
func (r *recorder) deleting(pod string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.pods[pod]
	if s == nil {
		s = &podSeen{name: pod}
		r.pods[pod] = s
	}
	s.deleteSent = time.Now()
}

// allStopped reports whether every container of p (init containers, so a
// native sidecar, included) is reported terminated.
func allStopped(p *corev1.Pod) bool {
	if len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		if cs.State.Terminated == nil {
			return false
		}
	}
	return true
}

// record starts informers on the pods labelled app=app and on the Lease
// lease, until the test ends.
func record(t *testing.T, app, lease string) *recorder {
	r := &recorder{pods: map[string]*podSeen{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pods := informers.NewSharedInformerFactoryWithOptions(cluster.kube, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "app=" + app }))
	leases := informers.NewSharedInformerFactoryWithOptions(cluster.kube, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + lease }))
	_, _ = pods.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.pod(o, false) },
		UpdateFunc: func(_, o any) { r.pod(o, false) },
		DeleteFunc: func(o any) { r.pod(o, true) },
	})
	_, _ = leases.Coordination().V1().Leases().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.lease,
		UpdateFunc: func(_, o any) { r.lease(o) },
	})
	pods.Start(ctx.Done())
	leases.Start(ctx.Done())
	syncCtx, synced := context.WithTimeout(ctx, 30*time.Second)
	defer synced()
	for _, f := range []informers.SharedInformerFactory{pods, leases} {
		for typ, ok := range f.WaitForCacheSync(syncCtx.Done()) {
			if !ok {
				t.Fatalf("the informer on %v did not sync within 30s", typ)
			}
		}
	}
	return r
}

// informerPod is the Pod of an informer's event: the object itself, or
// the last state known of a Pod deleted while the watch was down
// (cache.DeletedFinalStateUnknown); false for anything else.
func informerPod(o any) (*corev1.Pod, bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	p, ok := o.(*corev1.Pod)
	return p, ok
}

func (r *recorder) pod(o any, deleted bool) {
	now := time.Now()
	p, ok := informerPod(o)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.pods[p.Name]
	if s == nil {
		s = &podSeen{name: p.Name}
		r.pods[p.Name] = s
	}
	if p.DeletionTimestamp != nil && s.terminating.IsZero() {
		s.terminating, s.deadline = now, p.DeletionTimestamp.Time
	}
	if p.DeletionTimestamp != nil && s.stopped.IsZero() && allStopped(p) {
		s.stopped = now
	}
	if deleted && s.gone.IsZero() {
		s.gone = now
	}
}

func (r *recorder) lease(o any) {
	now := time.Now()
	l, ok := o.(*coordinationv1.Lease)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	h := holderSeen{at: now, holder: ptr.Deref(l.Spec.HolderIdentity, "")}
	if l.Spec.RenewTime != nil {
		h.renewed = l.Spec.RenewTime.Time
	}
	h.duration = time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
	r.holders = append(r.holders, h)
}

// podOf returns the pod name in a holder identity (pod name, "_", UID or
// random suffix).
func podOf(holder string) string {
	name, _, _ := strings.Cut(holder, "_")
	return name
}

// holderAt returns the holder last observed at or before t.
func (r *recorder) holderAt(t time.Time) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holderAtLocked(t)
}

func (r *recorder) holderAtLocked(t time.Time) string {
	h := ""
	for _, o := range r.holders {
		if o.at.After(t) {
			break
		}
		h = o.holder
	}
	return h
}

// checkTerms fails the test where the Lease was taken by a new holder
// before the previous holder's term was over: the new holder's renewTime
// (its acquireTime, on a takeover) before the previous holder's last
// renewTime plus its lease duration, with no release (the Lease seen free)
// in between. The same holder identity renewing is one holder: a
// restarted sidecar of the same pod.
func (r *recorder) checkTerms(t *testing.T, lease string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var prev holderSeen // the last observation of the holder before
	for _, o := range r.holders {
		switch {
		case o.holder == "":
			prev = holderSeen{}
		case prev.holder != "" && o.holder != prev.holder:
			if end := prev.renewed.Add(prev.duration); o.renewed.Before(end) {
				t.Errorf("Lease %s taken by %s at %s, %s before the term of %s ended (renewed %s, lease duration %s), with no release between",
					lease, o.holder, o.renewed.Format("15:04:05.000"), end.Sub(o.renewed).Round(time.Millisecond),
					prev.holder, prev.renewed.Format("15:04:05.000"), prev.duration)
			}
			prev = o
		default:
			prev = o
		}
	}
	t.Logf("Lease %s, each change of holder:\n%s", lease, r.changesLocked())
}

// moves counts how many times the Lease passed from one pod to another
// between from and to (a free Lease between two holders is no move; the
// same pod's new elector is none either), and returns the pods that held
// it in turn, the holder at from first.
func (r *recorder) moves(from, to time.Time) (int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var path []string
	if h := podOf(r.holderAtLocked(from)); h != "" {
		path = append(path, h)
	}
	for _, o := range r.holders {
		if !o.at.After(from) || o.at.After(to) {
			continue
		}
		if h := podOf(o.holder); h != "" && (len(path) == 0 || path[len(path)-1] != h) {
			path = append(path, h)
		}
	}
	return max(len(path)-1, 0), path
}

// changes is the Lease's each change of holder, a line each.
func (r *recorder) changes() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changesLocked()
}

func (r *recorder) changesLocked() string {
	var changes []string
	for i, o := range r.holders {
		if i == 0 || o.holder != r.holders[i-1].holder {
			changes = append(changes, fmt.Sprintf("  %s seen held by %q, renewed %s, lease duration %s",
				o.at.Format("15:04:05.000"), o.holder, o.renewed.Format("15:04:05.000"), o.duration))
		}
	}
	if len(changes) == 0 {
		return "  (not seen)"
	}
	return strings.Join(changes, "\n")
}

// freeBeforeEachHolder is, for each move between from and to (as moves
// counts them), how long the Lease was free before its new holder took it,
// by the Lease's own stamps, not by when this watch saw them (which lags
// under load): from the release's renewTime (the leaving holder's clock,
// at its release write) to the new holder's first renewTime (its acquiring
// write's). Where no release was seen (taken at expiry), from the old
// holder's last renewTime plus its lease duration.
func (r *recorder) freeBeforeEachHolder(from, to time.Time) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gaps []time.Duration
	var last holderSeen // the last holder seen, or the release after it
	if h := r.holderAtLocked(from); h != "" {
		for _, o := range r.holders {
			if !o.at.After(from) && o.holder == h {
				last = o
			}
		}
	}
	for _, o := range r.holders {
		if !o.at.After(from) || o.at.After(to) {
			continue
		}
		switch {
		case o.holder == "":
			if last.holder != "" {
				last = o
			}
		case last.holder == "" && !last.at.IsZero():
			// Taken after a release.
			gaps = append(gaps, o.renewed.Sub(last.renewed))
			last = o
		case podOf(last.holder) != "" && podOf(o.holder) != podOf(last.holder):
			// Taken at expiry.
			gaps = append(gaps, o.renewed.Sub(last.renewed.Add(last.duration)))
			last = o
		default:
			last = o
		}
	}
	return gaps
}
