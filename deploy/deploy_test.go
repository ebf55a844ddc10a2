// Package deploy holds the chart rendered as plain manifests
// (deploy/handoff.yaml). Its tests check the chart with helm lint --strict
// and helm-unittest, that the manifests are the chart's current rendering,
// and that a real kube-apiserver accepts every object (server-side dry run).
package deploy_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

var update = flag.Bool("update", false, "rewrite deploy/handoff.yaml from the chart")

// Render is how deploy/handoff.yaml is made from the chart.
var render = []string{"template", "handoff", "../charts/handoff", "--namespace", "handoff", "--kube-version", "1.35.0", "--set", "createNamespace=true"}

func TestMain(m *testing.M) { kubetest.Run(m) }

// helm runs the pinned helm (charttest.Helm).
func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	return charttest.Helm(t, args...)
}

func TestChartLints(t *testing.T) {
	for _, set := range []string{"", "certs.certManager.enabled=true,rbac.sidecarBindings[0].namespace=shop,rbac.sidecarBindings[0].serviceAccount=orders,rbac.sidecarBindings[0].leases={orders-leader}",
		"createNamespace=true,namespacePodSecurity=baseline,webhook.metricsSecure=false,rbac.webhookCABundleOnly=false,networkPolicy.sidecar.workerIngress[0].from[0].podSelector.matchLabels.app=frontend,networkPolicy.sidecar.workerIngress[0].ports[0].port=8000,networkPolicy.sidecar.namespaces={shop},networkPolicy.scraper.namespaceSelector.matchLabels.team=monitoring"} {
		args := []string{"lint", "--strict", "../charts/handoff"}
		if set != "" {
			args = append(args, "--set", set)
		}
		helm(t, args...)
	}
}

func TestChartUnitTests(t *testing.T) {
	helm(t, "unittest", "../charts/handoff")
	helm(t, "unittest", "../charts/handoff-workload")
}

func TestWorkloadChartLints(t *testing.T) {
	// With its defaults, as a platform team lints a chart first.
	helm(t, "lint", "--strict", "../charts/handoff-workload", "--kube-version", charttest.KubeVersion)
	helm(t, "lint", "--strict", "../charts/handoff-workload", "--kube-version", charttest.KubeVersion,
		"--set", "serviceAccount.name=orders", "--set", "leases={orders-leader}", "--set", "shards.prefix=orders-", "--set", "shards.count=4")
}

func TestChartRefusesBadValues(t *testing.T) {
	cmd := exec.Command(charttest.Tool(t, "helm"), append(render, "--set", "webhook.failurePolicy=Sometimes")...)
	msg, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(msg), "/webhook/failurePolicy") || !strings.Contains(string(msg), "'Ignore', 'Fail'") {
		t.Errorf("helm template with a bad failurePolicy: %v\n%s", err, msg)
	}
}

func TestManifestsAreTheChartRendered(t *testing.T) {
	got := helm(t, render...)
	if *update {
		if err := os.WriteFile("handoff.yaml", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("handoff.yaml")
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("deploy/handoff.yaml is not the chart rendered (%v); run go test ./deploy -run TestManifests -update", err)
	}
}

// The apiserver accepts every object of deploy/handoff.yaml: a server-side
// apply with dryRun=All validates each against its schema.
func TestAPIServerAcceptsManifests(t *testing.T) {
	kinds := dryRunAll(t, decode(t, "handoff.yaml"))
	for _, k := range []string{"Namespace", "Deployment", "Service", "MutatingWebhookConfiguration", "PodDisruptionBudget", "ClusterRole",
		"ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount", "Secret", "NetworkPolicy", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if kinds[k] == 0 {
			t.Errorf("no %s in deploy/handoff.yaml", k)
		}
	}
}

// dryRunAll has the test's apiserver validate each object with a
// server-side apply, dryRun=All (creating the namespaces they name first),
// and returns how many of each kind there were. A refusal fails t.
func dryRunAll(t *testing.T, objs []*unstructured.Unstructured) map[string]int {
	t.Helper()
	env := kubetest.Get(t)
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(env.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(env.Config)))
	kinds := map[string]int{}
	for _, obj := range objs {
		// Namespaced objects cannot be dry-run into a namespace that does not exist.
		if ns := obj.GetNamespace(); ns != "" {
			if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Errorf("%s %s: %v", gvk.Kind, obj.GetName(), err)
			continue
		}
		var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			r = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		if _, err := r.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "deploy-test", DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("%s %s refused: %v", gvk.Kind, obj.GetName(), err)
		}
		kinds[gvk.Kind]++
	}
	return kinds
}

func decode(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return charttest.Decode(t, data)
}
