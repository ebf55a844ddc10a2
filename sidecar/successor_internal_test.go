package sidecar

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestPickSuccessors(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	pod := func(name, rev string, age time.Duration, leases string, up bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(t0.Add(-age)),
			Labels:      map[string]string{"pod-template-hash": rev},
			Annotations: map[string]string{annotationLeases: leases},
		}, Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
		if !up {
			p.Status.Conditions[0].Status = corev1.ConditionFalse
		}
		return p
	}
	deleting := pod("new-deleting", "new", 0, "work", true)
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	for _, tc := range []struct {
		name string
		pods []*corev1.Pod
		want map[string]string
	}{
		{"rolling update: the new revision, though an old pod is newer", []*corev1.Pod{
			pod("old-a", "old", time.Hour, "work", true), pod("old-b", "old", time.Second, "work", true),
			pod("new-1", "new", time.Minute, "work", true)}, map[string]string{"work": "new-1_uid-new-1"}},
		{"of the new revision, the newest", []*corev1.Pod{
			pod("old-a", "old", time.Hour, "work", true),
			pod("new-1", "new", time.Minute, "work", true), pod("new-2", "new", time.Second, "work", true)}, map[string]string{"work": "new-2_uid-new-2"}},
		{"scale-in: the newest of the same revision", []*corev1.Pod{
			pod("old-a", "old", time.Hour, "work", true), pod("old-b", "old", time.Minute, "work", true), pod("old-c", "old", 2*time.Minute, "work", true)},
			map[string]string{"work": "old-b_uid-old-b"}},
		{"not Ready, being deleted, or not a candidate: none", []*corev1.Pod{
			pod("old-a", "old", time.Hour, "work", true), pod("new-1", "new", 0, "work", false), deleting,
			pod("new-other", "new", 0, "other", true)}, map[string]string{}},
		{"per Lease", []*corev1.Pod{
			pod("old-a", "old", time.Hour, "work,cron", true), pod("new-1", "new", time.Minute, "work", true), pod("new-2", "new", time.Hour, " cron ", true)},
			map[string]string{"work": "new-1_uid-new-1", "cron": "new-2_uid-new-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := pickSuccessors("old-a", "uid-old-a", tc.pods, []string{"work", "cron"})
			if len(got) != len(tc.want) {
				t.Fatalf("picked %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("successor of %s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
		})
	}
}
