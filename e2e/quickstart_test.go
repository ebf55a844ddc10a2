//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/quickstart"
	"github.com/handoff-dev/handoff/sidecar"
)

// quickstartNamespace is where TestQuickstart's worker runs, enabled by the
// README's quickstart alone: none of the chart's rbac.sidecarBindings name
// it, so its rights come from the quickstart's handoff-workload release.
const quickstartNamespace = "e2e-quickstart"

// TestQuickstart runs the README's quickstart as written (the ```sh block
// after <!-- quickstart -->) with bash -euo pipefail against the e2e
// cluster. Its first command, the platform's helm install, is the one
// setup.chart ran (it builds its install from that command, with the e2e
// flags appended); this test runs the rest of the block: the
// handoff-workload chart from the same registry, the patch that enables a
// Deployment, a rollout restart, and kubectl handoff status. The block's
// variables point at this run: HANDOFF_VERSION and HANDOFF_CHARTS at the
// release setup built and pushed, NAMESPACE, DEPLOYMENT and LEASE at a
// Deployment of the example worker created here beforehand, unlabelled, on
// its namespace's default service account (its pods cannot start without
// a sidecar's token: the SDK refuses to, as any SDK worker's would). PATH
// gives the block helm (hack/tools.sh), kubectl (hack/kube-assets.sh) and
// kubectl-handoff (the CLI handoffCLI built), and KUBECONFIG the cluster;
// for a registry spoken to over plain HTTP a shell function adds helm's
// --plain-http. It asserts that the Deployment's pods then carry the
// sidecar, its install step, the preStop hook and the quickstart's service
// account; that the rollout's old pods handed over (a DrainStarted Event);
// and that kubectl handoff status showed the Lease and the pods.
func TestQuickstart(t *testing.T) {
	q, err := quickstart.Read(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	ctx := context.Background()
	const name = "quickstart"
	lease := name + "-leader"

	// The worker before handoff: the example worker's Deployment.
	_, err = cluster.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: quickstartNamespace}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		t.Fatalf("namespace %s exists, from an earlier run? kubectl delete namespace %s", quickstartNamespace, quickstartNamespace)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNamespace(t, quickstartNamespace) })
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](10),
					Containers: []corev1.Container{{
						Name: "worker", Image: images.pgworker, ImagePullPolicy: images.pullPolicy,
						Args: []string{"--database-url", cluster.podDBURL, "--lease", lease},
					}},
				},
			},
		},
	}
	if _, err := cluster.kube.AppsV1().Deployments(quickstartNamespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// What the block finds on PATH.
	tools, err := exec.Command("bash", "../hack/tools.sh").Output()
	if err != nil {
		t.Fatalf("hack/tools.sh: %v", err)
	}
	kubectlDir, err := exec.Command("bash", "../hack/kube-assets.sh", "kubectl").Output()
	if err != nil {
		t.Fatalf("hack/kube-assets.sh kubectl: %v", err)
	}
	plugins := t.TempDir()
	if err := os.Symlink(mustCLI(t), filepath.Join(plugins, "kubectl-handoff")); err != nil {
		t.Fatal(err)
	}
	path := strings.Join([]string{plugins, strings.TrimSpace(string(tools)), strings.TrimSpace(string(kubectlDir)), os.Getenv("PATH")}, string(os.PathListSeparator))

	var preamble string
	if plainHTTP(images.release.registry) {
		preamble = "helm() { command helm \"$@\" --plain-http; }\n"
	}
	charts := strings.TrimSuffix(images.release.record["WORKLOAD_CHART"], "/handoff-workload")
	runCtx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(runCtx, "bash", "-euo", "pipefail", "-c", preamble+q.Rest)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "PATH="+path, "KUBECONFIG="+cluster.kubeconfig,
		"HANDOFF_VERSION="+images.release.record["CHART_VERSION"], "HANDOFF_CHARTS="+charts,
		"NAMESPACE="+quickstartNamespace, "DEPLOYMENT="+name, "LEASE="+lease)
	started := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("the README's quickstart after its platform install (%s), in %s:\n%s", q.Rest, time.Since(started).Round(time.Second), out)
	if err != nil {
		t.Fatalf("the README's quickstart: %v", err)
	}

	// The Deployment's pods carry handoff.
	pods, err := cluster.kube.CoreV1().Pods(quickstartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue // an old pod still going
		}
		running++
		if err := injected(&p, name); err != nil {
			t.Errorf("pod %s: %v", p.Name, err)
		}
		if !strings.Contains(string(out), p.Name) {
			t.Errorf("kubectl handoff status did not show pod %s", p.Name)
		}
	}
	if running != 2 {
		t.Errorf("%d pods of %s after the quickstart; want 2", running, name)
	}
	for _, want := range []string{"Namespace " + quickstartNamespace, lease} {
		if !strings.Contains(string(out), want) {
			t.Errorf("kubectl handoff status did not show %q", want)
		}
	}

	// handoff check, which the README points at, passes the quickstart's
	// own set-up (its lease-rbac once took the workload chart's ClusterRole
	// for a Role that grants Leases by no name).
	if r, raw := handoffCheckIn(t, quickstartNamespace); !r.Success || r.status("lease-rbac") != "ok" {
		t.Errorf("handoff check -n %s on the quickstart's set-up:\n%s", quickstartNamespace, raw)
	}

	// The rollout restart replaced injected pods: each handed over.
	deadline := time.Now().Add(30 * time.Second)
	for {
		es, err := cluster.kube.CoreV1().Events(quickstartNamespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + sidecar.ReasonDrainStarted})
		if err != nil {
			t.Fatal(err)
		}
		if len(es.Items) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("no %s Event in %s: the rollout's old pods did not hand over", sidecar.ReasonDrainStarted, quickstartNamespace)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// injected says why pod p, of the quickstart's Deployment, is not as the
// quickstart's patch and the webhook make it: the sidecar as a native
// sidecar, its install step, the preStop hook on the worker, the label
// handoff.dev/injected, and the service account serviceAccount.
func injected(p *corev1.Pod, serviceAccount string) error {
	var sidecarNative, install bool
	for _, c := range p.Spec.InitContainers {
		switch c.Name {
		case inject.SidecarName:
			sidecarNative = c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		case inject.InstallName:
			install = true
		}
	}
	var hook bool
	for _, c := range p.Spec.Containers {
		if c.Name == "worker" {
			hook = c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Exec != nil
		}
	}
	switch {
	case !sidecarNative:
		return fmt.Errorf("no init container %s with restartPolicy Always", inject.SidecarName)
	case !install:
		return fmt.Errorf("no init container %s", inject.InstallName)
	case !hook:
		return fmt.Errorf("the worker container has no preStop exec hook")
	case p.Labels[inject.LabelInjected] != "true":
		return fmt.Errorf("label %s is %q; want \"true\"", inject.LabelInjected, p.Labels[inject.LabelInjected])
	case p.Spec.ServiceAccountName != serviceAccount:
		return fmt.Errorf("service account %q; want %q, the quickstart's", p.Spec.ServiceAccountName, serviceAccount)
	}
	return nil
}

// deleteNamespace deletes namespace ns (its pods hand over as they go, and
// the quickstart's handoff-workload release goes with its Secret) and waits
// up to two minutes for it to be gone.
func deleteNamespace(t *testing.T, ns string) {
	ctx := context.Background()
	if err := cluster.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete namespace %s: %v", ns, err)
		return
	}
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		if _, err := cluster.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
	}
	t.Errorf("namespace %s still there two minutes after its deletion", ns)
}
