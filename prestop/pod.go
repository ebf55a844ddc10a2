package prestop

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/handoff-dev/handoff/config"
)

// SourceProbeGracePeriod is the deadline source of a kill of the worker
// container whose liveness (or, before the container has started, startup)
// probe sets terminationGracePeriodSeconds: the kubelet gives a probe kill
// that grace period rather than the pod's.
const SourceProbeGracePeriod = "probeTerminationGracePeriod"

// Termination is what the pod's own object says about a trigger: when the
// sequence must be over, where that came from, and whether the pod is
// leaving (so the sidecar must not re-arm after the sequence).
type Termination struct {
	Deadline time.Time
	// Source is SourceDeletionTimestamp, SourceProbeGracePeriod or
	// SourceGracePeriod.
	Source string
	// Leaving is set when the pod will not run its worker again: it is
	// being deleted, it has finished (phase Failed or Succeeded, as after
	// an eviction), the kubelet marked it DisruptionTarget (eviction,
	// graceful node shutdown), or its restartPolicy is Never.
	Leaving bool
	// Why says which of the above, for the log; "" when not leaving.
	Why string
	// PodRead is set when the deadline and Leaving come from the pod's
	// object; unset when it could not be read (the grace period setting,
	// and Leaving unknown).
	PodRead bool
}

// TerminationOf returns the deadline of a trigger at now for the worker
// container named container in pod, and whether the pod is leaving. The
// kinds of kill, and the deadline each gets:
//
//   - the pod is being deleted (metadata.deletionTimestamp set: a delete,
//     with any --grace-period, or an API-initiated eviction): the
//     deletionTimestamp minus margin;
//   - a liveness or startup probe kill in a pod that stays (no
//     deletionTimestamp; the probe that applies is the liveness probe once
//     the container has started, the startup probe before): now plus the
//     probe's terminationGracePeriodSeconds, if set, minus margin;
//   - any other kill without a deletionTimestamp (a probe with no
//     terminationGracePeriodSeconds, a node-pressure eviction, a graceful
//     node shutdown): now plus the pod's spec.terminationGracePeriodSeconds
//     minus margin. The kubelet may give an eviction or a node shutdown
//     less (evictionMaxPodGracePeriod, 0 for a hard eviction,
//     shutdownGracePeriod): the pod object does not say so, and a kill
//     that comes sooner cuts the sequence short (unfinished claims are
//     left to the visibility timeout, an unreleased Lease expires).
//
// A nil pod (it could not be read) gives now plus gracePeriod minus margin,
// not leaving. container "" (unknown) skips the probe rule.
//
// Grace periods are bounded before any sum is made of them, so none wraps:
// gracePeriod is taken to 0 to config.MaxGracePeriod and margin to 0 to
// config.MaxDuration (config bounds the settings so already); a pod's or a
// probe's terminationGracePeriodSeconds, which the API takes as any int64,
// counts as 0 when negative (no time, as the kubelet, which runs no preStop
// hook then) and as config.MaxGracePeriodSeconds above it (the longest the
// kubelet waits), never as a deadline in the past.
func TerminationOf(pod *corev1.Pod, container string, now time.Time, gracePeriod, margin time.Duration) Termination {
	gracePeriod = within(gracePeriod, 0, config.MaxGracePeriod)
	margin = within(margin, 0, config.MaxDuration)
	// gracePeriod - margin, for each grace period, is within
	// [-MaxDuration, MaxGracePeriod]: no wrap.
	t := Termination{Deadline: now.Add(gracePeriod - margin), Source: SourceGracePeriod}
	if pod == nil {
		return t
	}
	t.PodRead = true
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		t.Deadline = now.Add(seconds(*g) - margin)
	}
	switch {
	case pod.DeletionTimestamp != nil:
		t.Leaving, t.Why = true, "being deleted"
	case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
		t.Leaving, t.Why = true, "phase "+string(pod.Status.Phase)
	case pod.Spec.RestartPolicy == corev1.RestartPolicyNever:
		t.Leaving, t.Why = true, "restartPolicy Never: the worker is not restarted"
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && !t.Leaving {
			t.Leaving, t.Why = true, "DisruptionTarget: "+c.Reason
		}
	}
	if pod.DeletionTimestamp != nil {
		t.Deadline, t.Source = pod.DeletionTimestamp.Add(-margin), SourceDeletionTimestamp
		return t
	}
	if g, ok := probeGracePeriod(pod, container); ok {
		t.Deadline, t.Source = now.Add(g-margin), SourceProbeGracePeriod
	}
	return t
}

// probeGracePeriod is the terminationGracePeriodSeconds of the probe that
// would kill container now: its liveness probe once started, its startup
// probe before (or the shorter of the two when its status is unknown).
func probeGracePeriod(pod *corev1.Pod, container string) (time.Duration, bool) {
	if container == "" {
		return 0, false
	}
	var spec *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == container {
			spec = &pod.Spec.Containers[i]
		}
	}
	if spec == nil {
		return 0, false
	}
	var started *bool
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == container {
			started = st.Started
		}
	}
	probeSeconds := func(p *corev1.Probe) (int64, bool) {
		if p == nil || p.TerminationGracePeriodSeconds == nil {
			return 0, false
		}
		return *p.TerminationGracePeriodSeconds, true
	}
	liveness, lok := probeSeconds(spec.LivenessProbe)
	startup, sok := probeSeconds(spec.StartupProbe)
	switch {
	case started != nil && *started:
		return seconds(liveness), lok
	case started != nil:
		return seconds(startup), sok
	case lok && sok:
		return seconds(min(liveness, startup)), true
	case lok:
		return seconds(liveness), true
	case sok:
		return seconds(startup), true
	}
	return 0, false
}

// seconds is a terminationGracePeriodSeconds as a duration from 0 to
// config.MaxGracePeriod: n * time.Second would wrap for n above
// config.MaxGracePeriodSeconds (10000000000 s gave a deadline 2346318 hours
// in the past), and a negative grace period leaves no time.
func seconds(n int64) time.Duration {
	return time.Duration(within(n, 0, config.MaxGracePeriodSeconds)) * time.Second
}

// within is v taken into [lo, hi].
func within[T int64 | time.Duration](v, lo, hi T) T { return min(max(v, lo), hi) }

// PodWatch keeps the pod's own object from a watch of it by name (a
// client-go informer with field selector metadata.name=<pod> in the pod's
// namespace), so that reading it at a trigger needs no request. It needs
// get, list and watch on pods.
type PodWatch struct {
	pods            corev1client.PodsGetter
	namespace, name string
	informer        cache.SharedIndexInformer
}

// NewPodWatch returns a watch of namespace/name; Run runs it.
func NewPodWatch(pods corev1client.PodsGetter, namespace, name string) *PodWatch {
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	api := pods.Pods(namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return api.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return api.Watch(ctx, o)
		},
	}
	return &PodWatch{pods: pods, namespace: namespace, name: name,
		informer: cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})}
}

// OnDeletion calls f, from the watch's goroutine (f must not block), when
// the watch sees the pod's metadata.deletionTimestamp set on an update of
// the pod it had seen without one: the deletion itself, about 0.1 s before
// the kubelet runs the preStop hook. A pod the watch first lists already
// being deleted (this process started after the deletion: a restarted
// sidecar) does not call it, nor does a pod that stays (a probe kill of the
// worker container sets no deletionTimestamp). Call it before Run.
func (w *PodWatch) OnDeletion(f func(pod *corev1.Pod)) {
	_, _ = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			old, ok := oldObj.(*corev1.Pod)
			pod, ok2 := newObj.(*corev1.Pod)
			if ok && ok2 && old.UID == pod.UID && old.DeletionTimestamp == nil && pod.DeletionTimestamp != nil {
				f(pod)
			}
		},
	})
}

// Run watches until ctx ends.
func (w *PodWatch) Run(ctx context.Context) { w.informer.RunWithContext(ctx) }

// Synced reports whether the watch has listed the pod.
func (w *PodWatch) Synced() bool { return w.informer.HasSynced() }

// Pod source names, for the log.
const (
	FromWatch = "watch"
	FromGet   = "get"
)

// Pod returns the pod: from the watch once it has synced, else from a GET
// bounded by timeout. from is FromWatch or FromGet. A pod that is not there
// (deleted and gone) is an error.
func (w *PodWatch) Pod(ctx context.Context, timeout time.Duration) (pod *corev1.Pod, from string, err error) {
	if w.Synced() {
		obj, ok, err := w.informer.GetStore().GetByKey(w.namespace + "/" + w.name)
		switch {
		case err != nil:
			return nil, FromWatch, err
		case !ok:
			return nil, FromWatch, fmt.Errorf("pod %s/%s not found", w.namespace, w.name)
		}
		return obj.(*corev1.Pod), FromWatch, nil
	}
	pod, err = w.Get(ctx, timeout)
	return pod, FromGet, err
}

// Get reads the pod from the API (a quorum read), bounded by timeout.
func (w *PodWatch) Get(ctx context.Context, timeout time.Duration) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pod, err := w.pods.Pods(w.namespace).Get(ctx, w.name, metav1.GetOptions{})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("get pod %s/%s: no answer within %s", w.namespace, w.name, timeout)
		}
		return nil, err
	}
	return pod, nil
}
