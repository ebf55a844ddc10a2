//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/sidecar"
)

// netpolNamespace is where TestNetworkPoliciesOnlyNarrow runs: a namespace
// with its own default deny, enabled by the handoff-workload chart alone.
const netpolNamespace = "e2e-netpol"

// sidecarPort is the sidecar's metrics and probe port (7451 by default).
const sidecarPort = 7451

// TestNetworkPoliciesOnlyNarrow installs the handoff-workload chart, with
// its NetworkPolicy, in a namespace whose own policy denies every ingress,
// on the e2e cluster, whose kube-router enforces NetworkPolicy
// (e2e/cluster/up.sh). The chart is given a scraper (pods labelled
// app=scraper) and one worker port, pgworker's fault endpoint, for the
// frontend (app=frontend). From three netprobe pods of the namespace it
// asserts that:
//   - another pod (app=stranger) is refused at the sidecar's port and at
//     the worker's: the chart opened nothing the namespace's default deny
//     closes (the chart's allowOtherPorts, on by default before, admitted
//     the stranger at the worker's port);
//   - the scraper reaches the sidecar's metrics, and only them;
//   - the frontend reaches the worker's port it was given, and only it;
//   - the kubelet's probes are admitted: the sidecar's startup and
//     readiness probes and a liveness probe on the worker's port keep
//     every pod Ready with no restart;
//   - a rollout restart hands the role Lease over through it: the Lease
//     is held by a new pod and an old one recorded LeaseReleased.
func TestNetworkPoliciesOnlyNarrow(t *testing.T) {
	ctx := context.Background()
	ns := netpolNamespace
	const name = "netpol"
	lease := name + "-leader"
	kube := cluster.kube

	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		t.Fatalf("namespace %s exists, from an earlier run? kubectl delete namespace %s", ns, ns)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNamespace(t, ns) })

	// The namespace's own policy: no ingress to any of its pods.
	_, err = kube.NetworkingV1().NetworkPolicies(ns).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "default-deny"},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// The workload chart as its team installs it, from the release's registry.
	args := []string{"install", name + "-handoff", images.release.record["WORKLOAD_CHART"], "--version", images.release.record["CHART_VERSION"],
		"--namespace", ns, "--wait", "--timeout", "2m",
		"--set", "serviceAccount.name=" + name, "--set", "leases={" + lease + "}",
		"--set-json", `networkPolicy.podLabels={"app":"` + name + `"}`,
		"--set-json", `networkPolicy.scraper={"podSelector":{"matchLabels":{"app":"scraper"}}}`,
		"--set-json", fmt.Sprintf(`networkPolicy.ingress=[{"from":[{"podSelector":{"matchLabels":{"app":"frontend"}}}],"ports":[{"protocol":"TCP","port":%d}]}]`, faultPort)}
	if plainHTTP(images.release.registry) {
		args = append(args, "--plain-http")
	}
	if out, err := runTool("helm", args...); err != nil {
		t.Fatalf("helm install of the workload chart: %v\n%s", err, out)
	}

	for _, app := range []string{"stranger", "scraper", "frontend"} {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: app, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{
					Name: "netprobe", Image: images.netprobe, ImagePullPolicy: images.pullPolicy,
					Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				}},
			},
		}
		if _, err := kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      map[string]string{"app": name, inject.LabelInject: "true"},
					Annotations: map[string]string{"handoff.dev/leases": lease, "handoff.dev/role-leases": lease},
				},
				Spec: corev1.PodSpec{
					ServiceAccountName:            name,
					TerminationGracePeriodSeconds: ptr.To[int64](10),
					Containers: []corev1.Container{{
						Name: "worker", Image: images.pgworker, ImagePullPolicy: images.pullPolicy,
						Args: []string{"--database-url", cluster.podDBURL, "--lease", lease, "--fault-addr", fmt.Sprintf(":%d", faultPort)},
						LivenessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(faultPort)}},
							PeriodSeconds: 1, TimeoutSeconds: 2, FailureThreshold: 3,
						},
					}},
				},
			},
		},
	}
	if _, err := kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodsReady(t, ns, "app in (stranger,scraper,frontend)", 3, 2*time.Minute)
	workers := waitPodsReady(t, ns, "app="+name, 2, 2*time.Minute)

	// What each probe reaches on each worker pod. The policies are applied
	// by kube-router a moment after the pods appear: each expectation is
	// waited for, then held for the rest of the checks.
	type want struct {
		from string
		port int
		path string
		open bool
	}
	wants := []want{
		{"stranger", sidecarPort, "/metrics", false},
		{"stranger", faultPort, "/healthz", false},
		{"scraper", sidecarPort, "/metrics", true},
		{"scraper", faultPort, "/healthz", false},
		{"frontend", faultPort, "/healthz", true},
		{"frontend", sidecarPort, "/metrics", false},
	}
	for _, p := range workers {
		for _, w := range wants {
			target := fmt.Sprintf("http://%s:%d%s", p.Status.PodIP, w.port, w.path)
			deadline := time.Now().Add(30 * time.Second)
			for {
				open, detail := netprobe(ctx, t, ns, w.from, target)
				if open == w.open {
					t.Logf("%s -> %s (pod %s): %s", w.from, target, p.Name, detail)
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("%s -> %s (pod %s): open=%v (%s) for 30s; want open=%v", w.from, target, p.Name, open, detail, w.open)
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
		}
	}

	// The kubelet's probes were admitted all along: Ready, never restarted.
	for _, p := range workers {
		got := getPodIn(t, ns, p.Name)
		for _, s := range append(got.Status.InitContainerStatuses, got.Status.ContainerStatuses...) {
			if s.RestartCount != 0 {
				t.Errorf("pod %s: container %s restarted %d times: a probe the policies refused?", p.Name, s.Name, s.RestartCount)
			}
		}
	}

	// A handover through the policies: a rollout restart moves the Lease to
	// a new pod, and an old one released it.
	old := map[string]bool{}
	for _, p := range workers {
		old[p.Name] = true
	}
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	if _, err := kube.AppsV1().Deployments(ns).Patch(ctx, name, "application/strategic-merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		l, err := kube.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
		holder := holderOf(l, err)
		released, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + sidecar.ReasonLeaseReleased})
		if err != nil {
			t.Fatal(err)
		}
		if holder != "" && !old[holder] && len(released.Items) > 0 {
			t.Logf("Lease %s held by new pod %s after the rollout; %d LeaseReleased Events", lease, holder, len(released.Items))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 2m of the rollout: Lease %s held by %q (old pods %v), %d LeaseReleased Events; want a new pod and one", lease, holder, old, len(released.Items))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// holderOf is the holder identity of Lease l (get's result), or "".
func holderOf(l *coordinationv1.Lease, err error) string {
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// netprobe has the netprobe pod from, in namespace ns, GET target through
// the API server's pod proxy, and says whether the target answered, with
// the probe's account ("open: 200 OK", "closed: … i/o timeout").
func netprobe(ctx context.Context, t *testing.T, ns, from, target string) (bool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body, err := cluster.kube.CoreV1().Pods(ns).ProxyGet("http", from, "8080", "get", map[string]string{"url": target}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("netprobe %s (GET %s): %v: the probe itself did not answer", from, target, err)
	}
	answer := strings.TrimSpace(string(body))
	switch {
	case strings.HasPrefix(answer, "open: "):
		return true, answer
	case strings.HasPrefix(answer, "closed: "):
		return false, answer
	}
	t.Fatalf("netprobe %s (GET %s) answered %q; want open: or closed:", from, target, answer)
	return false, ""
}

// waitPodsReady waits until n pods match selector in ns, each Ready and
// not being deleted, and returns them.
func waitPodsReady(t *testing.T, ns, selector string, n int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		pods, err := cluster.kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		var ready []corev1.Pod
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && isReady(&p) {
				ready = append(ready, p)
			}
		}
		if len(ready) == n && len(pods.Items) == n {
			return ready
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pods %s in %s Ready after %s", len(ready), n, selector, ns, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// isReady says whether p's Ready condition is true.
func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// getPodIn returns pod name of namespace ns.
func getPodIn(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := cluster.kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
