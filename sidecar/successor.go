package sidecar

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
)

// labelInjected is the label injection sets on every pod it injects
// (inject.LabelInjected; not imported, so that the sidecar's binary does
// not link the injector): the successor's candidates are found by it.
const labelInjected = config.AnnotationPrefix + "injected"

// annotationLeases is the pod annotation that lists the Leases a pod
// competes for (the setting "leases").
const annotationLeases = config.AnnotationPrefix + "leases"

// Revision labels: a Deployment's ReplicaSets set pod-template-hash, a
// StatefulSet's and a DaemonSet's controller-revision-hash.
var revisionLabels = []string{"pod-template-hash", "controller-revision-hash"}

// maxCandidatePods bounds the pods read to pick successors: a namespace with
// more injected pods than this gets no successor (its standbys compete, as
// without the setting).
const maxCandidatePods = 1000

// successorListTimeout bounds the one watch-list of the candidates; it runs
// from the trigger, beside the revoke of the app's leadership.
const successorListTimeout = 2 * time.Second

// pickWait bounds how long after the pick's start (the trigger) a release
// waits for it, when the app's acknowledgement of the revoke came first:
// after it, the release names no successor and every standby competes. It
// counts from the trigger, not from the acknowledgement, so that the two
// waits overlap instead of adding up: before, a release waited up to
// 250 ms after the acknowledgement, so an app that took 200 ms to stop its
// leader work could hold the Lease 450 ms. 250 ms is above the slowest
// pick of 200 injected pods measured with other readers of pods beside, on
// a loaded 2-core machine (215 ms; with only writes beside, one pick in 60
// took 743 ms: docs/performance.md, "The successor's pick"): a late pick
// lets an old pod win the race, which costs a rollout a second move.
const pickWait = 250 * time.Millisecond

// pickSettings are how a Coordinator's sequences pick a successor.
type pickSettings struct {
	resourceVersion string        // of the watch-list (pickResourceVersion)
	wait            time.Duration // from the trigger (pickWait)
}

// successors is one sequence's pick of a successor for each Lease the pod
// releases: found once, from the trigger, and read at each release write.
type successors struct {
	leases []string      // the Leases it picks for; none for noSuccessors
	done   chan struct{} // closed when picked, err and at are set
	picked map[string]string
	err    error
	at     time.Time // when the pick ended, on the sequence's clock
	// by is when a release stops waiting for the pick (pickWait after its
	// start), on the real clock: it bounds an API call.
	by time.Time
}

// noSuccessors is a pick that names no one, already done.
func noSuccessors() *successors {
	s := &successors{done: make(chan struct{})}
	close(s.done)
	return s
}

// wants reports whether s picks a successor for lease.
func (s *successors) wants(lease string) bool { return slices.Contains(s.leases, lease) }

// ended is when the pick ended, and whether it has.
func (s *successors) ended() (time.Time, bool) {
	select {
	case <-s.done:
		return s.at, true
	default:
		return time.Time{}, false
	}
}

// wait waits for the pick until s.by, and at most d, of real time: it
// bounds an API call, not a step of the sequence's clock.
func (s *successors) wait(d time.Duration) {
	if !s.by.IsZero() {
		d = min(d, time.Until(s.by))
	}
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.done:
	case <-t.C:
	}
}

// of is the holder identity picked for lease, "" if none (or not picked
// yet).
func (s *successors) of(lease string) string {
	select {
	case <-s.done:
		return s.picked[lease]
	default:
		return ""
	}
}

// findSuccessors starts the pick of a successor for each of leases among
// the pod's peers, in the background; nil pods (the pod unknown) or the
// setting prefer-successor false pick none.
func (c *Coordinator) findSuccessors(leases []string) *successors {
	if c.podAPI == nil || !c.s.PreferSuccessor || len(leases) == 0 {
		return noSuccessors()
	}
	c.mu.Lock()
	pick := c.pick
	c.mu.Unlock()
	s := &successors{leases: leases, done: make(chan struct{}), by: time.Now().Add(pick.wait)}
	go func() {
		defer close(s.done)
		ctx, cancel := context.WithTimeout(context.Background(), successorListTimeout)
		defer cancel()
		pods, err := listInjected(ctx, c.podAPI.Pods(c.s.PodNamespace), pick.resourceVersion)
		s.at = c.clock.Now()
		if err != nil {
			s.err = err
			c.log.Info("no successor named: the candidates could not be listed", "reason", err.Error())
			return
		}
		s.picked = pickSuccessors(c.s.PodName, c.s.PodUID, pods, leases)
	}()
	return s
}

// pickResourceVersion is the resourceVersion of the pick's watch-list:
// "0", the apiserver's watch cache as it is, without waiting for it to
// catch up with etcd. A consistent read (resourceVersion unset) first asks
// etcd for its current revision, then waits until the cache of pods has
// seen it; that revision counts every write to any resource, so the wait
// lasts until a pod event or an etcd progress notification reaches the
// cache, which the apiserver requests at most every 100 ms
// (k8s.io/apiserver, storage/cacher: getWatchCacheResourceVersion,
// waitUntilWatchCacheFreshAndForceAllEvents, progress.ConditionalProgressRequester).
// A stale view is safe for a pick: it names a pod that stays as the cache
// knew it a few milliseconds before, and a named successor that has since
// gone, or never comes, leaves the Lease free for
// leaderelection.SuccessorGrace before every standby competes, as a
// release naming none does at once (docs/performance.md, "The successor's
// pick").
const pickResourceVersion = "0"

// listInjected reads the injected pods of one namespace by a watch that
// sends the current pods first (the apiserver's WatchList: an RBAC watch
// grant suffices, which every sidecar has, where a list needs another),
// ending at the bookmark that marks the end of those. resourceVersion is
// the watch's: "0" for the watch cache's current state, "" for a
// consistent read, which waits for the cache to be as fresh as etcd
// (pickResourceVersion). It returns an error past maxCandidatePods, on a
// watch error, or when ctx ends first (an apiserver without WatchList
// sends no such bookmark).
func listInjected(ctx context.Context, api corev1client.PodInterface, resourceVersion string) ([]*corev1.Pod, error) {
	w, err := api.Watch(ctx, metav1.ListOptions{
		LabelSelector:        labelInjected + "=true",
		SendInitialEvents:    ptr.To(true),
		ResourceVersion:      resourceVersion,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
	})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var pods []*corev1.Pod
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the watch-list of injected pods did not end: %w", ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, fmt.Errorf("the watch-list of injected pods ended before its last pod")
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				if p, ok := ev.Object.(*corev1.Pod); ok {
					if len(pods) == maxCandidatePods {
						return nil, fmt.Errorf("more than %d injected pods in the namespace", maxCandidatePods)
					}
					pods = append(pods, p)
				}
			case watch.Bookmark:
				if p, ok := ev.Object.(*corev1.Pod); ok && p.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
					return pods, nil
				}
			case watch.Error:
				return nil, fmt.Errorf("the watch-list of injected pods failed: %v", ev.Object)
			}
		}
	}
}

// pickSuccessors picks, for each of leases, the pod that should hold it
// after this one (name, uid): among the other pods that compete for it
// (annotation handoff.dev/leases) and are up (PeerUp: running, Ready, not
// being deleted), one of another revision than this pod's first (in a
// rolling update, the new one's), then the newest, then by name. It
// returns holder identities by Lease name; a Lease with no such pod is
// absent.
func pickSuccessors(name, uid string, pods []*corev1.Pod, leases []string) map[string]string {
	mine := ""
	for _, p := range pods {
		if p.Name == name {
			mine = revisionOf(p)
		}
	}
	var up []*corev1.Pod
	for _, p := range pods {
		if p.Name != name && string(p.UID) != uid && PeerUp(p) {
			up = append(up, p)
		}
	}
	slices.SortFunc(up, func(a, b *corev1.Pod) int {
		// Another revision than the leaving pod's first: that is the one a
		// rolling update replaces it by.
		if c := cmp.Compare(boolInt(revisionOf(b) != mine), boolInt(revisionOf(a) != mine)); c != 0 {
			return c
		}
		if c := b.CreationTimestamp.Compare(a.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	out := map[string]string{}
	for _, lease := range leases {
		for _, p := range up {
			if competesFor(p, lease) {
				out[lease] = p.Name + "_" + string(p.UID)
				break
			}
		}
	}
	return out
}

// revisionOf is the pod's revision label, "" without one.
func revisionOf(p *corev1.Pod) string {
	for _, l := range revisionLabels {
		if v, ok := p.Labels[l]; ok {
			return l + "=" + v
		}
	}
	return ""
}

// competesFor reports whether the pod's handoff.dev/leases annotation
// lists lease.
func competesFor(p *corev1.Pod, lease string) bool {
	for n := range strings.SplitSeq(p.Annotations[annotationLeases], ",") {
		if strings.TrimSpace(n) == lease {
			return true
		}
	}
	return false
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// roundSuccessors is a round's pick, set when its sequence starts.
type roundSuccessors struct{ p atomic.Pointer[successors] }

// of is the holder identity picked for lease by the round's sequence, ""
// before the sequence or when none was picked: Config.Successor.
func (r *roundSuccessors) of(lease string) string {
	if s := r.p.Load(); s != nil {
		return s.of(lease)
	}
	return ""
}
