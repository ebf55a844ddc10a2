package deploy_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// The chart's Namespace enforces the restricted Pod Security level, which
// the apiserver's PodSecurity admission applies: the webhook's pod, as its
// Deployment makes it, is admitted there, and a pod that runs as root is
// refused.
func TestWebhookPodMeetsTheRestrictedLevelItsNamespaceEnforces(t *testing.T) {
	needHelm(t)
	env := kubetest.Get(t)
	ctx := context.Background()
	ns := fmt.Sprintf("psa-%d", os.Getpid())
	objs := charttest.Decode(t, helm(t, "template", "handoff", "../charts/handoff", "--namespace", ns, "--kube-version", "1.35.0",
		"--set", "createNamespace=true", "--show-only", "templates/namespace.yaml", "--show-only", "templates/deployment.yaml"))
	var namespace corev1.Namespace
	var deployment appsv1.Deployment
	for _, obj := range objs {
		var into any = &deployment
		if obj.GetKind() == "Namespace" {
			into = &namespace
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, into); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &namespace, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	pod := &corev1.Pod{ObjectMeta: deployment.Spec.Template.ObjectMeta, Spec: deployment.Spec.Template.Spec}
	pod.Name = "webhook"
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, dryRun); err != nil {
		t.Errorf("the webhook's pod in its restricted namespace: %v", err)
	}

	root := pod.DeepCopy()
	root.Spec.SecurityContext.RunAsNonRoot = nil
	root.Spec.Containers[0].SecurityContext.RunAsNonRoot = nil
	root.Spec.Containers[0].SecurityContext.RunAsUser = nil
	_, err := env.Client.CoreV1().Pods(ns).Create(ctx, root, dryRun)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `violates PodSecurity "restricted:latest"`) {
		t.Errorf("a pod that may run as root in the namespace: %v; want Forbidden: violates PodSecurity \"restricted:latest\"", err)
	}
}
