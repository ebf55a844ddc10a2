// Package prestop is the preStop entry to the shutdown sequence: the hook
// client that `handoff prestop` runs in the worker container, the sidecar's
// handler it calls, and the deadline taken from the pod's own deletion.
package prestop

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Deadline sources.
const (
	SourceDeletionTimestamp = "deletionTimestamp"
	SourceGracePeriod       = "gracePeriod"
)

// podGetTimeout bounds the GET of the pod; past it the grace period is used.
const podGetTimeout = 2 * time.Second

// Deadline returns when the shutdown sequence must be over, and its source.
// It GETs the pod namespace/name and uses its metadata.deletionTimestamp,
// which reflects `--grace-period` overrides and evictions, minus margin. If
// the GET fails, times out after 2 s, or the pod is not being deleted, it
// returns now + gracePeriod - margin. err is the reason the
// deletionTimestamp was not used, for the log; the deadline is always valid.
func Deadline(ctx context.Context, pods corev1client.PodsGetter, namespace, name string, now time.Time, gracePeriod, margin time.Duration) (deadline time.Time, source string, err error) {
	fallback := now.Add(gracePeriod - margin)
	if pods == nil || name == "" {
		return fallback, SourceGracePeriod, fmt.Errorf("pod name unknown")
	}
	ctx, cancel := context.WithTimeout(ctx, podGetTimeout)
	defer cancel()
	pod, err := pods.Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fallback, SourceGracePeriod, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	if pod.DeletionTimestamp == nil {
		return fallback, SourceGracePeriod, fmt.Errorf("pod %s/%s has no deletionTimestamp", namespace, name)
	}
	return pod.DeletionTimestamp.Add(-margin), SourceDeletionTimestamp, nil
}
