package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/cli/check"
	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/protocol"
)

// checkReport is what handoff check -o json prints (internal/cli/check).
type checkReport struct {
	Success    bool `json:"success"`
	Categories []struct {
		Name   string `json:"name"`
		Checks []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Detail string `json:"detail"`
			Hint   string `json:"hint"`
		} `json:"checks"`
	} `json:"categories"`
}

// The statuses of a check, and where its hint is, as check prints them.
const (
	checkOK       = "ok"
	checkWarning  = "warning"
	checkFailed   = "failed"
	checkSkipped  = "skipped"
	checkHintBase = "https://github.com/handoff-dev/handoff/blob/main/docs/checks.md#"
)

// runCheck runs handoff check args... -o json and returns its report and
// whether it failed.
func runCheck(t *testing.T, args ...string) (checkReport, string, bool) {
	t.Helper()
	var out bytes.Buffer
	err := command.Execute(context.Background(), check.Command, append(args, "-o", "json"), nil, &out, &out)
	var r checkReport
	if derr := json.Unmarshal(out.Bytes(), &r); derr != nil {
		t.Fatalf("handoff check %s: %v (exit %v)\n%s", strings.Join(args, " "), derr, err, out.String())
	}
	if (err != nil) == r.Success {
		t.Errorf("handoff check: error %v with success %t; want an error exactly when a check failed", err, r.Success)
	}
	return r, out.String(), err != nil
}

// statuses maps each check ID to its status.
func (r checkReport) statuses() map[string]string {
	m := map[string]string{}
	for _, c := range r.Categories {
		for _, ch := range c.Checks {
			m[ch.ID] = ch.Status
		}
	}
	return m
}

// expectChecks fails the test unless each check in want has its status.
func expectChecks(t *testing.T, what string, r checkReport, raw string, want map[string]string) {
	t.Helper()
	got := r.statuses()
	for id, status := range want {
		if got[id] != status {
			t.Errorf("%s: check %s is %q, want %q\n%s", what, id, got[id], status, raw)
		}
	}
}

// On the real apiserver with the real webhook process installed with the
// chart's objects (failurePolicy Ignore, as the chart's default), handoff
// check passes; then each thing a test breaks is named by its check: a
// workload's RoleBinding deleted (lease-rbac), a pod whose budget cannot
// work (budgets), the webhook stopped, so that a labelled pod starts
// without the sidecar (webhook-injects, pods-injected), and a caBundle that
// is not a certificate (webhook-ca-bundle).
func TestCheckPassesAHealthyInstallAndNamesEachBreak(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	w := startChartWebhook(t, env, "Ignore")
	w.rotated(t, nil)
	ns := w.podNs
	kube := env.Client

	// A workload: its service account, its Role for its Lease, and a pod
	// injected through the webhook.
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "orders"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "orders-leases"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"orders-leader"}, Verbs: []string{"get", "update", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "orders-leases"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "orders-leases"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "orders", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	worker := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{inject.LabelInject: "true"}, Annotations: map[string]string{config.AnnotationPrefix + "leases": "orders-leader"}},
			Spec:       corev1.PodSpec{ServiceAccountName: "orders", Containers: []corev1.Container{{Name: "worker", Image: "worker:1"}}},
		}
	}
	createInjected(t, env, ns, worker("orders-0"))

	args := []string{"--kubeconfig", env.Kubeconfig, "-n", ns}
	r, raw, failed := runCheck(t, args...)
	if failed {
		t.Fatalf("handoff check on a healthy install failed:\n%s", raw)
	}
	expectChecks(t, "healthy", r, raw, map[string]string{
		"api-reachable": checkOK, "kubernetes-version": checkOK, "webhook-config": checkOK, "webhook-ca-bundle": checkOK,
		"webhook-ca-expiry": checkOK, "webhook-endpoints": checkOK, "webhook-injects": checkOK, "pods-injected": checkOK,
		"lease-rbac": checkOK, "budgets": checkOK, "deletion-cost": checkOK,
	})
	// The webhook runs as a process here, not as a pod: no webhook version to compare.
	expectChecks(t, "healthy", r, raw, map[string]string{"sidecar-versions": checkSkipped})
	// --pre skips the live checks.
	pre, raw, _ := runCheck(t, append(args, "--pre")...)
	expectChecks(t, "--pre", pre, raw, map[string]string{"api-reachable": checkOK, "install-rights": checkOK, "no-webhook-yet": checkWarning, "webhook-injects": ""})

	// A Role from an older chart: update alone on its Lease, no patch (the
	// release of a Lease left held), no pods/status (the phase).
	role, err := kube.RbacV1().Roles(ns).Get(ctx, "orders-leases", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role.Rules = []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"orders-leader"}, Verbs: []string{"get", "update"}}}
	if _, err := kube.RbacV1().Roles(ns).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var leaseRBAC string
	kubetest.WaitFor(t, 10*time.Second, "lease-rbac to fail on the older Role", func() bool {
		r, raw, _ = runCheck(t, args...)
		leaseRBAC = raw
		return r.statuses()["lease-rbac"] == checkFailed
	})
	for _, want := range []string{"may not patch its Leases orders-leader", "may not patch pods/status"} {
		if !strings.Contains(leaseRBAC, want) {
			t.Errorf("lease-rbac on a Role without patch: the output does not say %q:\n%s", want, leaseRBAC)
		}
	}

	// The workload's RoleBinding gone: its sidecars could not hold their Lease.
	if err := kube.RbacV1().RoleBindings(ns).Delete(ctx, "orders-leases", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitFor(t, 10*time.Second, "lease-rbac to fail", func() bool {
		r, _, _ = runCheck(t, args...)
		return r.statuses()["lease-rbac"] == checkFailed
	})

	// A pod whose renew deadline is not shorter than its lease duration,
	// and whose grace period is all deadline-margin and handback-reserve.
	bad := worker("orders-bad")
	bad.Labels[inject.LabelInjected], bad.Annotations[inject.AnnotationStatus] = "true", inject.StatusInjected
	bad.Spec.TerminationGracePeriodSeconds = ptr.To[int64](4)
	bad.Spec.InitContainers = []corev1.Container{{Name: inject.SidecarName, Image: "handoff:test", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Env: []corev1.EnvVar{{Name: "HANDOFF_LEASES", Value: "orders-leader"}, {Name: "HANDOFF_RENEW_DEADLINE", Value: "20s"}}}}
	if _, err := kube.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, raw, _ = runCheck(t, args...)
	expectChecks(t, "a bad budget", r, raw, map[string]string{"budgets": checkFailed})
	for _, want := range []string{"orders-bad", "renew-deadline"} {
		if !strings.Contains(raw, want) {
			t.Errorf("the budgets check does not name %q:\n%s", want, raw)
		}
	}
	if err := kube.CoreV1().Pods(ns).Delete(ctx, "orders-bad", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	bad.Name, bad.Spec.InitContainers[0].Env = "orders-short-grace", bad.Spec.InitContainers[0].Env[:1]
	if _, err := kube.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, raw, _ = runCheck(t, args...)
	expectChecks(t, "a grace period with no time to drain", r, raw, map[string]string{"budgets": checkFailed})
	if !strings.Contains(raw, "terminationGracePeriodSeconds 4 leaves no time to drain") {
		t.Errorf("the budgets check does not name the grace period:\n%s", raw)
	}

	// Pods opted in to pod-deletion-cost whose sidecar (a native sidecar,
	// and one of the legacy layout) has run for two minutes and written
	// none: a warning naming them, which the cost, once written, ends.
	sidecar := corev1.Container{Name: inject.SidecarName, Image: "handoff:test",
		Env: []corev1.EnvVar{{Name: "HANDOFF_LEASES", Value: "orders-leader"}, {Name: "HANDOFF_DELETION_COST", Value: "true"}}}
	running := []corev1.ContainerStatus{{Name: inject.SidecarName, Image: "handoff:test", Started: ptr.To(true),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(time.Now().Add(-2 * time.Minute))}}}}
	for _, legacy := range []bool{false, true} {
		opted := worker("orders-cost")
		opted.Labels[inject.LabelInjected], opted.Annotations[inject.AnnotationStatus] = "true", inject.StatusInjected
		opted.Annotations[protocol.DeletionCostOptIn] = "true"
		status := corev1.PodStatus{Phase: corev1.PodRunning, InitContainerStatuses: running}
		if legacy {
			opted.Name = "orders-cost-legacy"
			opted.Spec.Containers = append(opted.Spec.Containers, sidecar)
			status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: append(slices.Clone(running),
				corev1.ContainerStatus{Name: "worker", Image: "worker:1", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}})}
		} else {
			native := sidecar
			native.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
			opted.Spec.InitContainers = []corev1.Container{native}
		}
		p, err := kube.CoreV1().Pods(ns).Create(ctx, opted, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = status
		if _, err := kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		r, raw, _ = runCheck(t, args...)
		expectChecks(t, "an opted-in pod with no pod-deletion-cost ("+opted.Name+")", r, raw, map[string]string{"deletion-cost": checkWarning})
		if !strings.Contains(raw, ns+"/"+opted.Name) || !strings.Contains(raw, checkHintBase+"deletion-cost") {
			t.Errorf("the deletion-cost check does not name %s, or gives no hint:\n%s", opted.Name, raw)
		}
		if _, err := kube.CoreV1().Pods(ns).Patch(ctx, opted.Name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+corev1.PodDeletionCost+`":"0"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		r, raw, _ = runCheck(t, args...)
		expectChecks(t, "the opted-in pod with its cost ("+opted.Name+")", r, raw, map[string]string{"deletion-cost": checkOK})
		if err := kube.CoreV1().Pods(ns).Delete(ctx, opted.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
	}

	// The webhook stopped: with failurePolicy Ignore a labelled pod starts
	// without the sidecar, and only the checks say so.
	terminate(t, w.cmd, w.exited, "webhook")
	if _, err := kube.CoreV1().Pods(ns).Create(ctx, worker("orders-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, raw, _ = runCheck(t, args...)
	expectChecks(t, "the webhook stopped", r, raw, map[string]string{"webhook-injects": checkFailed, "pods-injected": checkFailed})
	if !strings.Contains(raw, ns+"/orders-1") {
		t.Errorf("pods-injected does not name the pod that runs without the sidecar:\n%s", raw)
	}

	// A caBundle that is not a certificate (the rotator is stopped).
	c, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, w.release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.Webhooks {
		c.Webhooks[i].ClientConfig.CABundle = []byte("not a certificate")
	}
	if _, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, raw, _ = runCheck(t, args...)
	expectChecks(t, "a caBundle that is not a certificate", r, raw, map[string]string{"webhook-ca-bundle": checkFailed, "webhook-ca-expiry": checkSkipped})
	if !strings.Contains(raw, checkHintBase+"webhook-ca-bundle") {
		t.Errorf("a failed check gives no hint URL:\n%s", raw)
	}
}

// A workload enabled the README quickstart's way, with the handoff-workload
// chart: RBAC grants its service account every Lease of its namespace
// through the ClusterRole <release>-sidecar, and the admission policy
// <release>-sidecar-lease-grants refuses its writes of a Lease it is not
// granted hold on by name. lease-rbac passes it (it failed it before,
// taking the ClusterRole for a Role that grants Leases by no name), and
// fails it, naming the Lease and the policy, once the grant of hold is gone.
func TestCheckLeaseRBACKnowsSelfService(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	w := startChartWebhook(t, env, "Ignore")
	w.rotated(t, nil)
	ns := w.podNs
	kube := env.Client
	charttest.Create(t, env.Config, charttest.Render(t, w.release, w.ns, "--show-only", "templates/sidecar-self-service.yaml"))
	charttest.Create(t, env.Config, charttest.Decode(t, charttest.Helm(t, "template", "mail-handoff", filepath.Join(charttest.Root(t), "charts", "handoff-workload"),
		"--namespace", ns, "--kube-version", "1.35.0", "--show-only", "templates/rbac.yaml",
		"--set", "serviceAccount.name=mail", "--set", "leases={mail-leader}", "--set", "sidecarClusterRole="+w.release+"-sidecar")))
	createInjected(t, env, ns, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "mail-0", Labels: map[string]string{inject.LabelInject: "true"}, Annotations: map[string]string{config.AnnotationPrefix + "leases": "mail-leader"}},
		Spec:       corev1.PodSpec{ServiceAccountName: "mail", Containers: []corev1.Container{{Name: "worker", Image: "worker:1"}}},
	})

	args := []string{"--kubeconfig", env.Kubeconfig, "-n", ns}
	r, raw, _ := runCheck(t, args...)
	expectChecks(t, "self-service", r, raw, map[string]string{"lease-rbac": checkOK})

	if err := kube.RbacV1().Roles(ns).Delete(ctx, "handoff-leases-mail", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var out string
	kubetest.WaitFor(t, 10*time.Second, "lease-rbac to fail without the grant of hold", func() bool {
		r, raw, _ = runCheck(t, args...)
		out = raw
		return r.statuses()["lease-rbac"] == checkFailed
	})
	for _, want := range []string{"is not granted hold on its Leases mail-leader", w.release + "-sidecar-lease-grants"} {
		if !strings.Contains(out, want) {
			t.Errorf("lease-rbac without the grant of hold: the output does not say %q:\n%s", want, out)
		}
	}
}

// createInjected creates pod in ns through the chart's webhook, retrying
// for up to a minute until the webhook injects it (until the API server
// has its configuration and caBundle, a pod is created without the
// sidecar: it is deleted and created again).
func createInjected(t *testing.T, env *kubetest.Env, ns string, pod *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	kubetest.WaitFor(t, 60*time.Second, "a pod injected through the webhook", func() bool {
		p, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod.DeepCopy(), metav1.CreateOptions{})
		if err == nil && p.Labels[inject.LabelInjected] != "true" {
			_ = env.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			return false
		}
		return err == nil
	})
}
