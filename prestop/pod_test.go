package prestop_test

import (
	"math"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/prestop"
)

func TestTerminationOfEachKindOfKill(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	const margin = 2 * time.Second
	deleting := metav1.NewTime(now.Add(7 * time.Second))
	probe := func(seconds int64) *corev1.Probe {
		return &corev1.Probe{TerminationGracePeriodSeconds: ptr.To(seconds)}
	}
	pod := func(mutate func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: ptr.To[int64](30),
				RestartPolicy:                 corev1.RestartPolicyAlways,
				Containers:                    []corev1.Container{{Name: "app"}, {Name: "worker", LivenessProbe: probe(10), StartupProbe: probe(5)}},
			},
			Status: corev1.PodStatus{Phase: corev1.PodRunning,
				ContainerStatuses: []corev1.ContainerStatus{{Name: "worker", Started: ptr.To(true)}}},
		}
		if mutate != nil {
			mutate(p)
		}
		return p
	}
	for _, tc := range []struct {
		name       string
		pod        *corev1.Pod
		container  string
		want       time.Duration // after now
		wantSource string
		leaving    bool
	}{
		{"pod unread: the configured grace period", nil, "worker", 20*time.Second - margin, prestop.SourceGracePeriod, false},
		{"deletion: the deletionTimestamp, leaving", pod(func(p *corev1.Pod) { p.DeletionTimestamp = &deleting }), "worker",
			7*time.Second - margin, prestop.SourceDeletionTimestamp, true},
		{"liveness kill of a started container: the liveness probe's grace period", pod(nil), "worker",
			10*time.Second - margin, prestop.SourceProbeGracePeriod, false},
		{"startup probe kill of a container not started: the startup probe's", pod(func(p *corev1.Pod) {
			p.Status.ContainerStatuses[0].Started = ptr.To(false)
		}), "worker", 5*time.Second - margin, prestop.SourceProbeGracePeriod, false},
		{"status unknown: the shorter probe grace period", pod(func(p *corev1.Pod) { p.Status.ContainerStatuses = nil }), "worker",
			5*time.Second - margin, prestop.SourceProbeGracePeriod, false},
		{"probe without its own grace period: the pod's", pod(func(p *corev1.Pod) {
			p.Spec.Containers[1].LivenessProbe.TerminationGracePeriodSeconds = nil
		}), "worker", 30*time.Second - margin, prestop.SourceGracePeriod, false},
		{"worker container unknown: the pod's grace period", pod(nil), "", 30*time.Second - margin, prestop.SourceGracePeriod, false},
		{"worker container not in the pod: the pod's grace period", pod(nil), "other", 30*time.Second - margin, prestop.SourceGracePeriod, false},
		{"node-pressure eviction (DisruptionTarget, no deletionTimestamp): the pod's grace period, leaving", pod(func(p *corev1.Pod) {
			p.Spec.Containers[1].LivenessProbe = nil
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "TerminationByKubelet"}}
		}), "worker", 30*time.Second - margin, prestop.SourceGracePeriod, true},
		{"evicted pod (phase Failed): leaving", pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), "worker",
			10*time.Second - margin, prestop.SourceProbeGracePeriod, true},
		{"restartPolicy Never: the worker does not come back", pod(func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyNever }), "worker",
			10*time.Second - margin, prestop.SourceProbeGracePeriod, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := prestop.TerminationOf(tc.pod, tc.container, now, 20*time.Second, margin)
			if !got.Deadline.Equal(now.Add(tc.want)) || got.Source != tc.wantSource || got.Leaving != tc.leaving {
				t.Errorf("got deadline now+%s from %s, leaving %t (%s); want now+%s from %s, leaving %t",
					got.Deadline.Sub(now), got.Source, got.Leaving, got.Why, tc.want, tc.wantSource, tc.leaving)
			}
			if got.Leaving && got.Why == "" {
				t.Error("leaving without a reason")
			}
		})
	}
}

// A probe's or the pod's terminationGracePeriodSeconds beyond what a
// time.Duration holds (the API accepts any int64) does not wrap to a
// deadline in the past, which would make a liveness kill skip the drain:
// a grace period too long for a time.Duration counts as the longest one
// (config.MaxGracePeriod); a negative one as none.
func TestTerminationOfOutOfRangeGracePeriods(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	const margin = 2 * time.Second
	longest := config.MaxGracePeriod - margin
	pod := func(podGrace int64, liveness, startup *int64, started *bool) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: ptr.To(podGrace),
				RestartPolicy:                 corev1.RestartPolicyAlways,
				Containers: []corev1.Container{{Name: "worker",
					LivenessProbe: &corev1.Probe{TerminationGracePeriodSeconds: liveness},
					StartupProbe:  &corev1.Probe{TerminationGracePeriodSeconds: startup}}},
			},
			Status: corev1.PodStatus{Phase: corev1.PodRunning,
				ContainerStatuses: []corev1.ContainerStatus{{Name: "worker", Started: started}}},
		}
	}
	for _, tc := range []struct {
		name       string
		pod        *corev1.Pod
		want       time.Duration // after now
		wantSource string
	}{
		{"liveness probe 10000000000 s", pod(30, ptr.To[int64](10000000000), nil, ptr.To(true)), longest, prestop.SourceProbeGracePeriod},
		{"startup probe 10000000000 s", pod(30, nil, ptr.To[int64](10000000000), ptr.To(false)), longest, prestop.SourceProbeGracePeriod},
		{"liveness probe MaxInt64 s", pod(30, ptr.To[int64](math.MaxInt64), nil, ptr.To(true)), longest, prestop.SourceProbeGracePeriod},
		{"status unknown: the shorter, both beyond", pod(30, ptr.To[int64](18446744080), ptr.To[int64](math.MaxInt64), nil), longest, prestop.SourceProbeGracePeriod},
		{"status unknown: the shorter, one beyond", pod(30, ptr.To[int64](18446744080), ptr.To[int64](7), nil), 7*time.Second - margin, prestop.SourceProbeGracePeriod},
		{"the longest probe grace period", pod(30, ptr.To(config.MaxGracePeriodSeconds), nil, ptr.To(true)), longest, prestop.SourceProbeGracePeriod},
		{"pod 9223372036854775807 s", pod(math.MaxInt64, nil, nil, ptr.To(true)), longest, prestop.SourceGracePeriod},
		{"pod 10000000000 s", pod(10000000000, nil, nil, ptr.To(true)), longest, prestop.SourceGracePeriod},
		{"pod -9223372036854775808 s: none", pod(math.MinInt64, nil, nil, ptr.To(true)), -margin, prestop.SourceGracePeriod},
		{"pod -5 s: none", pod(-5, nil, nil, ptr.To(true)), -margin, prestop.SourceGracePeriod},
		{"probe -1 s: none", pod(30, ptr.To[int64](-1), nil, ptr.To(true)), -margin, prestop.SourceProbeGracePeriod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := prestop.TerminationOf(tc.pod, "worker", now, 20*time.Second, margin)
			if !got.Deadline.Equal(now.Add(tc.want)) || got.Source != tc.wantSource {
				t.Errorf("deadline now%+.0fh (%s) from %s; want now%+.0fh from %s",
					got.Deadline.Sub(now).Hours(), got.Deadline, got.Source, tc.want.Hours(), tc.wantSource)
			}
		})
	}
	// The settings, out of their bounds, are taken to them too: a grace
	// period past the longest and a margin past 1h or below 0.
	for _, tc := range []struct {
		grace, margin, want time.Duration
	}{
		{math.MaxInt64, 2 * time.Second, config.MaxGracePeriod - 2*time.Second},
		{30 * time.Second, math.MinInt64, 30 * time.Second},
		{30 * time.Second, math.MaxInt64, 30*time.Second - config.MaxDuration},
		{math.MinInt64, math.MaxInt64, -config.MaxDuration},
	} {
		if got := prestop.TerminationOf(nil, "worker", now, tc.grace, tc.margin); !got.Deadline.Equal(now.Add(tc.want)) {
			t.Errorf("grace period %d ns, margin %d ns: deadline now%+.0fs; want now%+.0fs", int64(tc.grace), int64(tc.margin), got.Deadline.Sub(now).Seconds(), tc.want.Seconds())
		}
	}
}
