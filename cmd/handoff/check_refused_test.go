package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// The chart's webhook (failurePolicy Ignore) with a real
// kube-controller-manager's Deployment and ReplicaSet controllers: without
// the chart's require-injection policy, require-injection-policy warns;
// with it, check passes while the webhook injects a Deployment's pod. With
// the webhook stopped, a rollout restart's new ReplicaSet is refused its
// pod (FailedCreate, the policy's message), no pod starts without the
// sidecar, and pods-not-refused fails naming the ReplicaSet, its
// Deployment, the pod it waits for and where to look; once the webhook is
// back, the ReplicaSet's retries create the pod, injected, and the check
// passes with the refusals still in its Events.
func TestCheckNamesTheRolloutsTheRequireInjectionPolicyHolds(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	w := startChartWebhook(t, env, "Ignore")
	w.rotated(t, nil)
	ns := w.podNs
	kube := env.Client
	args := []string{"--kubeconfig", env.Kubeconfig, "-n", ns}
	policy := w.release + "-require-injection"

	r, raw, _ := runCheck(t, args...)
	expectChecks(t, "no require-injection policy", r, raw, map[string]string{"require-injection-policy": checkWarning, "pods-not-refused": checkOK})
	if !strings.Contains(raw, "no ValidatingAdmissionPolicy "+policy+": pods that ask for injection would be admitted without the sidecar while the webhook is down") ||
		!strings.Contains(raw, checkHintBase+"require-injection-policy") {
		t.Errorf("require-injection-policy does not name the missing policy and what it costs, or gives no hint:\n%s", raw)
	}

	// The chart's policy, selecting the namespace as its webhook does.
	charttest.Create(t, env.Config, charttest.Render(t, w.release, w.ns, "--show-only", "templates/require-injection-policy.yaml",
		"--set-json", `webhook.namespaceSelector={"matchLabels":{"kubernetes.io/metadata.name":"`+ns+`"}}`))
	// The API server takes policies up asynchronously: a pod with the
	// marks of injection and no sidecar (the webhook leaves it alone) is
	// refused once it has.
	marked := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "marked", Labels: map[string]string{inject.LabelInject: "true", inject.LabelInjected: "true"},
		Annotations: map[string]string{inject.AnnotationStatus: inject.StatusInjected}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "worker:1"}}}}
	kubetest.WaitFor(t, 15*time.Second, "the require-injection policy to take effect", func() bool {
		_, err := kube.CoreV1().Pods(ns).Create(ctx, marked, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "the handoff webhook did not inject pod")
	})

	stopKCM, err := env.StartControllerManager("deployment", "replicaset")
	if err != nil {
		t.Fatal(err)
	}
	defer stopKCM()
	labels := map[string]string{"app": "orders", inject.LabelInject: "true"}
	if _, err := kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "orders"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "orders"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "worker:1"}}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// pods are the Deployment's pods; each must carry the sidecar.
	pods := func() []corev1.Pod {
		t.Helper()
		list, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=orders"})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			if p.Labels[inject.LabelInjected] != "true" || !slices.ContainsFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.SidecarName }) {
				t.Fatalf("pod %s of the Deployment runs without the sidecar", p.Name)
			}
		}
		return list.Items
	}
	kubetest.WaitFor(t, 60*time.Second, "the Deployment's pod, injected", func() bool { return len(pods()) == 1 })
	r, raw, failed := runCheck(t, args...)
	if failed {
		t.Fatalf("handoff check with the policy and the webhook up failed:\n%s", raw)
	}
	expectChecks(t, "the policy installed", r, raw, map[string]string{"require-injection-policy": checkOK, "pods-not-refused": checkOK})

	// The webhook stopped, then a rollout restart (as kubectl's).
	terminate(t, w.cmd, w.exited, "webhook")
	restart := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	if _, err := kube.AppsV1().Deployments(ns).Patch(ctx, "orders", types.MergePatchType, []byte(restart), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitFor(t, 60*time.Second, "the new ReplicaSet's FailedCreate with the policy's denial", func() bool {
		evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedCreate"})
		return err == nil && slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
			return e.InvolvedObject.Kind == "ReplicaSet" && strings.Contains(e.Message, "ValidatingAdmissionPolicy '"+policy+"'")
		})
	})
	if n := len(pods()); n != 1 {
		t.Errorf("%d pods of the Deployment while the webhook is down; want the old one alone", n)
	}
	r, raw, failed = runCheck(t, args...)
	if !failed {
		t.Errorf("handoff check passed while a rollout waits for the webhook:\n%s", raw)
	}
	t.Logf("handoff check -o json while the rollout waits:\n%s", raw)
	expectChecks(t, "a rollout refused", r, raw, map[string]string{"pods-not-refused": checkFailed, "webhook-injects": checkFailed, "require-injection-policy": checkOK})
	for _, want := range []string{
		"1 workload waits for pods the require-injection policy (" + policy + ") refuses, because the webhook did not inject them",
		"ReplicaSet " + ns + "/orders-", "(Deployment orders): 1 pod waiting, refused ",
		"Is the webhook's Deployment scaled down, or are its pods not ready (see webhook-endpoints and webhook-injects)?",
		checkHintBase + "pods-not-refused",
	} {
		if !strings.Contains(raw, want) {
			t.Errorf("pods-not-refused does not say %q:\n%s", want, raw)
		}
	}

	// The webhook back: the ReplicaSet's own retries create its pod,
	// injected; the refusals stay in the Events, but nothing waits.
	w.cmd, w.exited = runMain(t, w.args)
	kubetest.WaitFor(t, 2*time.Minute, "the new ReplicaSet's pod, injected, once the webhook is back", func() bool { return len(pods()) == 2 })
	kubetest.WaitFor(t, 30*time.Second, "handoff check to pass with the rollout's pod created", func() bool {
		r, raw, failed = runCheck(t, args...)
		return !failed
	})
	expectChecks(t, "the webhook back", r, raw, map[string]string{"pods-not-refused": checkOK, "webhook-injects": checkOK})
}
