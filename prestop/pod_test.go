package prestop_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

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
