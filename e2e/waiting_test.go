//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/handoff-dev/handoff/inject"
)

// TestRolloutWaitsForTheWebhook: with the webhook's failurePolicy Ignore
// (the chart's default; the e2e installs Fail, which the test turns to
// Ignore and back) and its Deployment scaled to 0 until its Service has no
// endpoint, a rollout restart of a labelled worker creates no pod: the
// chart's require-injection policy refuses each one the API server admitted
// without calling the webhook, and the new ReplicaSet records FailedCreate
// with the policy's denial. Until that Event is seen no new pod exists (none
// without the sidecar, none at all); handoff check fails, pods-not-refused
// naming the ReplicaSet and its Deployment. With the webhook scaled back, the
// rollout completes, every new pod injected.
func TestRolloutWaitsForTheWebhook(t *testing.T) {
	ctx := context.Background()
	const name = "waiting"
	deploy(t, worker(name, 2, 15))

	// The webhook's configuration: failurePolicy Ignore for the test, its
	// Service to watch.
	cfgs, err := cluster.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=handoff"})
	if err != nil || len(cfgs.Items) != 1 {
		t.Fatalf("the chart's MutatingWebhookConfiguration: %v (%d found, want 1)", err, len(cfgs.Items))
	}
	cfg := cfgs.Items[0]
	svc := cfg.Webhooks[0].ClientConfig.Service
	if svc == nil {
		t.Fatalf("webhook configuration %s calls a URL, not a Service", cfg.Name)
	}
	policy := cfg.Name + "-require-injection"
	setFailurePolicy := func(fp func(i int) admissionregistrationv1.FailurePolicyType) error {
		var ops []map[string]any
		for i := range cfg.Webhooks {
			ops = append(ops, map[string]any{"op": "replace", "path": fmt.Sprintf("/webhooks/%d/failurePolicy", i), "value": fp(i)})
		}
		patch, _ := json.Marshal(ops)
		_, err := cluster.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, cfg.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
		return err
	}
	if err := setFailurePolicy(func(int) admissionregistrationv1.FailurePolicyType { return admissionregistrationv1.Ignore }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := setFailurePolicy(func(i int) admissionregistrationv1.FailurePolicyType { return *cfg.Webhooks[i].FailurePolicy }); err != nil {
			t.Errorf("restoring the webhook's failurePolicy: %v", err)
		}
	})

	// The webhook's Deployment scaled to 0, until its Service has no
	// endpoint, ready or terminating.
	webhooks, err := cluster.kube.AppsV1().Deployments(svc.Namespace).Get(ctx, "handoff-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scale := func(n int32) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
		if _, err := cluster.kube.AppsV1().Deployments(svc.Namespace).Patch(ctx, webhooks.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// endpoints counts the Service's endpoints, and the ready ones.
	endpoints := func() (all, ready int, err error) {
		list, err := cluster.kube.DiscoveryV1().EndpointSlices(svc.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
		if err != nil {
			return 0, 0, err
		}
		for _, s := range list.Items {
			for _, ep := range s.Endpoints {
				all++
				if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
					ready++
				}
			}
		}
		return all, ready, nil
	}
	// scaleBack scales the webhook back and waits until it has a ready
	// endpoint, so that what runs after has its webhook.
	scaleBack := func() {
		t.Helper()
		scale(*webhooks.Spec.Replicas)
		waitUntil(t, 2*time.Minute, "the webhook's Service to have a ready endpoint", func() bool {
			_, ready, err := endpoints()
			return err == nil && ready > 0
		})
	}
	scale(0)
	restored := false
	t.Cleanup(func() {
		if !restored {
			scaleBack()
		}
	})
	waitUntil(t, 2*time.Minute, "the webhook's Service to have no endpoint, ready or terminating", func() bool {
		all, _, err := endpoints()
		return err == nil && all == 0
	})

	// pods are the worker's pods; none may run without the sidecar.
	pods := func() []string {
		t.Helper()
		list, err := cluster.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range list.Items {
			if p.Labels[inject.LabelInjected] != "true" || !slices.ContainsFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.SidecarName }) {
				t.Fatalf("pod %s of %s runs without the sidecar", p.Name, name)
			}
			names = append(names, p.Name)
		}
		return names
	}
	before := pods()
	restartedAt := time.Now()
	if out, err := kubectl(ctx, "rollout", "restart", "deployment/"+name).CombinedOutput(); err != nil {
		t.Fatalf("kubectl rollout restart: %v\n%s", err, out)
	}
	var refusal string
	waitUntil(t, 2*time.Minute, "a FailedCreate of the new ReplicaSet with the policy's denial", func() bool {
		if extra := slices.DeleteFunc(pods(), func(p string) bool { return slices.Contains(before, p) }); len(extra) > 0 {
			t.Fatalf("new pods %v of %s while the webhook is down; want none until it is back", extra, name)
		}
		evs, err := cluster.kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedCreate"})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "ReplicaSet" && strings.HasPrefix(e.InvolvedObject.Name, name+"-") &&
				!e.LastTimestamp.Time.Before(restartedAt.Truncate(time.Second)) && strings.Contains(e.Message, "ValidatingAdmissionPolicy '"+policy+"'") {
				refusal = e.Message
				return true
			}
		}
		return false
	})
	t.Logf("the new ReplicaSet's FailedCreate: %s", refusal)

	r, raw := handoffCheck(t)
	if r.Success || r.status("pods-not-refused") != "failed" ||
		!strings.Contains(raw, "for pods the require-injection policy ("+policy+") refuses") || !strings.Contains(raw, "(Deployment "+name+")") {
		t.Errorf("handoff check while the rollout waits: want pods-not-refused failed, naming the policy and Deployment %s\n%s", name, raw)
	}

	scaleBack()
	restored = true
	// The ReplicaSet retries with its backoff, which the refusals have
	// grown to about as long as the outage.
	waitRollout(t, name, 5*time.Minute)
	if now := pods(); len(slices.DeleteFunc(slices.Clone(now), func(p string) bool { return slices.Contains(before, p) })) != 2 {
		t.Errorf("pods of %s after the rollout: %v; want 2 new ones, injected", name, now)
	}
}

// waitUntil polls cond every 500 ms until it holds, or fails the test
// after timeout, naming what it waited for.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
	}
}
