package deploy_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// docs/uninstall.md on a real apiserver: with the chart installed and an
// injected pod running with its Lease, deleting every object of the
// release (what `helm uninstall` does) leaves no MutatingWebhookConfiguration,
// ValidatingAdmissionPolicy or binding of the release and none of its
// cluster-scoped objects, and leaves the injected pod and its Lease as they
// were (same resourceVersion, same holder): uninstalling loses nothing of
// the workloads' and leaves no webhook behind. Before, a labelled pod is
// refused while the webhook is away (the require-injection policy);
// after, it is created as it is, without a sidecar, and not refused.
// (No kubelet here: the pod's sidecar does not run; the e2e suite's
// upgrade test covers pods that do.)
func TestUninstallLeavesNoWebhookAndKeepsLeases(t *testing.T) {
	needHelm(t)
	env := kubetest.Get(t)
	ctx := context.Background()
	ns, workloads := env.Namespace(t), env.Namespace(t)
	release := "handoff-" + ns
	objs := charttest.Decode(t, helm(t, "template", release, "../charts/handoff", "--namespace", ns, "--kube-version", charttest.KubeVersion,
		// Sent only the test's workload namespace's pods.
		"--set-json", `webhook.namespaceSelector={"matchLabels":{"kubernetes.io/metadata.name":"`+workloads+`"}}`,
		"--set-json", `rbac.sidecarBindings=[{"namespace":"`+workloads+`","serviceAccount":"orders","leases":["orders-leader"]}]`))
	installed := charttest.Create(t, env.Config, objs)
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingAdmissionPolicy", "Deployment"} {
		if len(installed[kind]) == 0 {
			t.Fatalf("the chart rendered no %s", kind)
		}
	}

	// An injected pod (as the webhook injects it) and the Lease its sidecar holds.
	pods := env.Client.CoreV1().Pods(workloads)
	pod := labelledPod("orders")
	pod.Spec.ServiceAccountName = "orders"
	if _, err := inject.Pod(&pod.ObjectMeta, &pod.Spec, inject.Options{Image: "handoff-sidecar:test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the injected pod: %v", err)
	}
	holder := pod.Name + "_uid"
	lease, err := env.Client.CoordinationV1().Leases(workloads).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "orders-leader"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](15),
			AcquireTime: &metav1.MicroTime{Time: time.Now()}, RenewTime: &metav1.MicroTime{Time: time.Now()}, LeaseTransitions: ptr.To[int32](3)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Installed: a labelled pod the webhook did not inject is refused.
	kubetest.WaitFor(t, 15*time.Second, "the require-injection policy to take effect", func() bool {
		return refusedUninjected(createPod(t, workloads, labelledPod("before")))
	})

	// helm uninstall: every object of the release's manifest, deleted.
	dyn := dynamic.NewForConfigOrDie(env.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(env.Config)))
	resource := func(o *unstructured.Unstructured) dynamic.ResourceInterface {
		m, err := mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			t.Fatal(err)
		}
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			return dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		return dyn.Resource(m.Resource)
	}
	for _, o := range slices.Backward(objs) {
		if err := resource(o).Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("uninstall: delete %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}

	// Nothing of the release is left: no webhook configuration or
	// admission policy names it, and no object of its manifest is there.
	for _, r := range []struct {
		kind string
		list func() ([]string, error)
	}{
		{"MutatingWebhookConfiguration", func() ([]string, error) {
			l, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
			var names []string
			for _, x := range l.Items {
				names = append(names, x.Name)
			}
			return names, err
		}},
		{"ValidatingAdmissionPolicy", func() ([]string, error) {
			l, err := env.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
			var names []string
			for _, x := range l.Items {
				names = append(names, x.Name)
			}
			return names, err
		}},
		{"ValidatingAdmissionPolicyBinding", func() ([]string, error) {
			l, err := env.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{})
			var names []string
			for _, x := range l.Items {
				names = append(names, x.Name)
			}
			return names, err
		}},
	} {
		names, err := r.list()
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if strings.HasPrefix(n, release) {
				t.Errorf("after uninstall, %s %s is left", r.kind, n)
			}
		}
	}
	for _, o := range objs {
		if _, err := resource(o).Get(ctx, o.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("after uninstall, %s %s/%s: %v; want it gone", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}

	// The workload's own objects are as they were.
	after, err := env.Client.CoordinationV1().Leases(workloads).Get(ctx, "orders-leader", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Lease after uninstall: %v; want it kept", err)
	}
	if after.ResourceVersion != lease.ResourceVersion || ptr.Deref(after.Spec.HolderIdentity, "") != holder || ptr.Deref(after.Spec.LeaseTransitions, 0) != 3 {
		t.Errorf("the Lease after uninstall: resourceVersion %s holder %q transitions %d; want it untouched (%s, %q, 3)",
			after.ResourceVersion, ptr.Deref(after.Spec.HolderIdentity, ""), ptr.Deref(after.Spec.LeaseTransitions, 0), lease.ResourceVersion, holder)
	}
	kept, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil || kept.Annotations[inject.AnnotationStatus] != inject.StatusInjected ||
		!slices.ContainsFunc(kept.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.SidecarName }) {
		t.Errorf("the injected pod after uninstall: %v; want it kept with its sidecar", err)
	}

	// No webhook behind: a labelled pod is created as it is, no sidecar,
	// not refused (the API server drops the policy asynchronously).
	var plain *corev1.Pod
	kubetest.WaitFor(t, 15*time.Second, "a labelled pod to be created as it is", func() bool {
		p := labelledPod("after")
		if createPod(t, workloads, p) != nil {
			return false
		}
		plain, err = pods.Get(ctx, p.Name, metav1.GetOptions{})
		return err == nil
	})
	if plain.Annotations[inject.AnnotationStatus] != "" || len(plain.Spec.InitContainers) != 0 {
		t.Errorf("a labelled pod after uninstall: annotations %v, init containers %d; want it as created, without the sidecar", plain.Annotations, len(plain.Spec.InitContainers))
	}
}
