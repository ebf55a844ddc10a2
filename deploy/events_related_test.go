package deploy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/handoff-dev/handoff/internal/kubetest"
)

// An Event a sidecar's token records is about its own pod and names no
// other object as related: one about its own pod whose related object is
// another pod is refused (before: allowed, so a stolen token could attach
// its text to another pod's Events), one naming its own pod, or none, is
// not. The chart's policies on the real API server.
func TestSidecarEventNamesNoOtherPodAsRelated(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	const sa = "orders"
	applyAll(t, env.Config, renderSidecar(t, `[{"namespace":"`+ns+`","serviceAccount":"`+sa+`","leases":["orders-leader"]}]`), 1, 5) // 5: the pod-bound Leases, Events and status, the Lease names, the sidecar subjects
	podA, podB := env.Pod(t, ns, "orders-a", 30), env.Pod(t, ns, "orders-b", 30)
	asA := kubernetes.NewForConfigOrDie(impersonate(env.Config, ns, sa, podA.Name, string(podA.UID)))
	refA := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: podA.Name, UID: podA.UID}
	refB := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: podB.Name, UID: podB.UID}
	eventAbout := func(about corev1.ObjectReference, related *corev1.ObjectReference) error {
		_, err := asA.CoreV1().Events(ns).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe."},
			InvolvedObject: about, Related: related, Reason: "DrainStarted", Message: "test", Type: corev1.EventTypeNormal,
			Source: corev1.EventSource{Component: "handoff"}}, metav1.CreateOptions{})
		return err
	}
	event := func(related *corev1.ObjectReference) error { return eventAbout(refA, related) }
	kubetest.WaitFor(t, 15*time.Second, "the Role and the Event policy to take effect", func() bool {
		return event(nil) == nil && apierrors.IsForbidden(eventAbout(refB, nil))
	})
	err := event(&refB)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may name only its own pod (uid "+string(podA.UID)+") as the related object of an Event, not Pod "+ns+"/orders-b") {
		t.Errorf("an Event about its own pod related to pod B: %v; want Forbidden naming pod B", err)
	}
	if err := event(&refA); err != nil {
		t.Errorf("an Event about its own pod related to itself: %v; want it recorded", err)
	}
	if err := event(nil); err != nil {
		t.Errorf("an Event about its own pod, no related object: %v; want it recorded", err)
	}
}
