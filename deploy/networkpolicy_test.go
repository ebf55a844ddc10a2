package deploy_test

import (
	"context"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// Here, without a network plugin (the e2e suite's
// TestNetworkPoliciesOnlyNarrow tries them on a cluster where kube-router
// enforces them), the chart's policies are checked in two ways: the
// apiserver validates and defaults each rendered policy (a server-side dry
// run), and what comes back is evaluated port by port under the
// NetworkPolicy rules (a rule with no from admits any peer; a port with no
// number is every port of its protocol; endPort closes a range). The node's
// own traffic, which a policy always admits, is left out.

// admits reports whether np admits TCP, UDP or SCTP traffic to port from
// peer: nil is any peer, which only a rule without from admits.
func admits(np *networkingv1.NetworkPolicy, proto corev1.Protocol, port int32, peer *networkingv1.NetworkPolicyPeer) bool {
	for _, r := range np.Spec.Ingress {
		fromOK := len(r.From) == 0
		for _, f := range r.From {
			if peer != nil && reflect.DeepEqual(f, *peer) {
				fromOK = true
			}
		}
		if !fromOK {
			continue
		}
		if len(r.Ports) == 0 {
			return true
		}
		for _, p := range r.Ports {
			if *p.Protocol != proto {
				continue
			}
			if p.Port == nil {
				return true
			}
			end := p.Port.IntVal
			if p.EndPort != nil {
				end = *p.EndPort
			}
			if p.Port.IntVal <= port && port <= end {
				return true
			}
		}
	}
	return false
}

// dryRun creates the NetworkPolicies of a rendering with dryRun=All and
// returns them as the apiserver validated and defaulted them.
func dryRun(t *testing.T, env *kubetest.Env, rendered []byte) []*networkingv1.NetworkPolicy {
	t.Helper()
	res := dynamic.NewForConfigOrDie(env.Config).Resource(schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"})
	var out []*networkingv1.NetworkPolicy
	for _, obj := range charttest.Decode(t, rendered) {
		if obj.GetKind() != "NetworkPolicy" {
			continue
		}
		got, err := res.Namespace(obj.GetNamespace()).Create(context.Background(), obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("the apiserver refuses NetworkPolicy %s/%s: %v", obj.GetNamespace(), obj.GetName(), err)
		}
		np := &networkingv1.NetworkPolicy{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, np); err != nil {
			t.Fatal(err)
		}
		out = append(out, np)
	}
	return out
}

func TestNetworkPoliciesAdmitOnlyTheScraperToMetrics(t *testing.T) {
	needHelm(t)
	env := kubetest.Get(t)
	release := env.Namespace(t) // the webhook's namespace
	shop, billing := env.Namespace(t), env.Namespace(t)
	scraper := networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "prometheus"}},
	}
	const scraperJSON = `networkPolicy.scraper={"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}},"podSelector":{"matchLabels":{"app":"prometheus"}}}`
	bindings := `rbac.sidecarBindings=[{"namespace":"` + shop + `","serviceAccount":"orders","leases":[]},{"namespace":"` + shop + `","serviceAccount":"mail","leases":[]},{"namespace":"` + billing + `","serviceAccount":"ledger","leases":[]}]`
	// A worker port of the example's, listed with its source: the frontend pods.
	frontend := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "frontend"}}}
	const workerJSON = `networkPolicy.sidecar.workerIngress=[{"from":[{"podSelector":{"matchLabels":{"app":"frontend"}}}],"ports":[{"protocol":"TCP","port":8000}]}]`
	for _, tc := range []struct {
		name       string
		set        []string
		port       int32 // the sidecar's
		withScrape bool
		worker     bool // TCP 8000 listed for the frontend
	}{
		{"defaults, no scraper", nil, 7451, false, false},
		{"a scraper", []string{"--set-json", scraperJSON}, 7451, true, false},
		{"the port moved to 9090", []string{"--set-json", scraperJSON, "--set", "networkPolicy.sidecar.metricsPort=9090"}, 9090, true, false},
		{"the first port", []string{"--set", "networkPolicy.sidecar.metricsPort=1"}, 1, false, false},
		{"the last port", []string{"--set", "networkPolicy.sidecar.metricsPort=65535"}, 65535, false, false},
		{"a worker port listed", []string{"--set-json", scraperJSON, "--set-json", workerJSON}, 7451, true, true},
		{"a worker port listed, no scraper", []string{"--set-json", workerJSON}, 7451, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "handoff", "../charts/handoff", "--namespace", release, "--kube-version", "1.35.0",
				"--show-only", "templates/networkpolicy-webhook.yaml", "--show-only", "templates/networkpolicy-sidecar.yaml",
				"--set-json", bindings}, tc.set...)
			policies := dryRun(t, env, helm(t, args...))
			if len(policies) != 3 {
				t.Fatalf("%d NetworkPolicies; want the webhook's and one per namespace of injected pods (2)", len(policies))
			}
			for _, np := range policies {
				if np.Namespace == release {
					// The webhook: 9443 from anyone; 8080 from the scraper only.
					for port, want := range map[int32]bool{9443: true, 8080: false, 8081: false, 443: false} {
						if got := admits(np, corev1.ProtocolTCP, port, nil); got != want {
							t.Errorf("webhook: TCP %d from any pod: %v; want %v", port, got, want)
						}
					}
					if got := admits(np, corev1.ProtocolTCP, 8080, &scraper); got != tc.withScrape {
						t.Errorf("webhook: metrics from the scraper: %v; want %v", got, tc.withScrape)
					}
					continue
				}
				if !reflect.DeepEqual(np.Spec.PodSelector.MatchLabels, map[string]string{"handoff.dev/injected": "true"}) {
					t.Errorf("%s: selects %v; want the injected pods", np.Namespace, np.Spec.PodSelector)
				}
				// Every port of every protocol: nothing from any pod, the
				// scraper only on the sidecar's port, the frontend only on
				// the worker port listed for it. What no policy admits stays
				// as the namespace's own policies decide: closed here.
				for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP} {
					for port := int32(1); port <= 65535; port++ {
						sidecar := proto == corev1.ProtocolTCP && port == tc.port
						worker := tc.worker && proto == corev1.ProtocolTCP && port == 8000
						if got := admits(np, proto, port, nil); got {
							t.Fatalf("%s: %s %d from any pod: admitted; want closed", np.Namespace, proto, port)
						}
						if got, want := admits(np, proto, port, &scraper), sidecar && tc.withScrape; got != want {
							t.Fatalf("%s: %s %d from the scraper: %v; want %v", np.Namespace, proto, port, got, want)
						}
						if got, want := admits(np, proto, port, &frontend), worker; got != want {
							t.Fatalf("%s: %s %d from the frontend: %v; want %v", np.Namespace, proto, port, got, want)
						}
					}
				}
			}
		})
	}
}

// The workload chart's policy, which the README's quickstart installs: by
// default only the node reaches an injected pod of its namespace (so a
// namespace's default deny is never widened); a scraper reaches only the
// sidecar's port; the worker's own ports only from the sources listed.
func TestWorkloadNetworkPolicyOnlyNarrows(t *testing.T) {
	needHelm(t)
	env := kubetest.Get(t)
	shop := env.Namespace(t)
	scraper := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}
	frontend := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "frontend"}}}
	for _, tc := range []struct {
		name            string
		set             []string
		scrape, worker  bool
		wantPodSelector map[string]string
	}{
		{"defaults", nil, false, false, map[string]string{"handoff.dev/injected": "true"}},
		{"scraper, worker port and the workload's labels", []string{
			"--set-json", `networkPolicy.scraper={"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}`,
			"--set-json", `networkPolicy.ingress=[{"from":[{"podSelector":{"matchLabels":{"app":"frontend"}}}],"ports":[{"protocol":"TCP","port":8000}]}]`,
			"--set-json", `networkPolicy.podLabels={"app":"orders"}`,
		}, true, true, map[string]string{"handoff.dev/injected": "true", "app": "orders"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "orders-handoff", "../charts/handoff-workload", "--namespace", shop, "--kube-version", "1.35.0",
				"--show-only", "templates/networkpolicy.yaml", "--set", "serviceAccount.name=orders"}, tc.set...)
			policies := dryRun(t, env, helm(t, args...))
			if len(policies) != 1 {
				t.Fatalf("%d NetworkPolicies; want 1", len(policies))
			}
			np := policies[0]
			if !reflect.DeepEqual(np.Spec.PodSelector.MatchLabels, tc.wantPodSelector) {
				t.Errorf("selects %v; want %v", np.Spec.PodSelector.MatchLabels, tc.wantPodSelector)
			}
			for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP} {
				for port := int32(1); port <= 65535; port++ {
					if admits(np, proto, port, nil) {
						t.Fatalf("%s %d from any pod: admitted; want closed", proto, port)
					}
					if got, want := admits(np, proto, port, &scraper), tc.scrape && proto == corev1.ProtocolTCP && port == 7451; got != want {
						t.Fatalf("%s %d from the scraper: %v; want %v", proto, port, got, want)
					}
					if got, want := admits(np, proto, port, &frontend), tc.worker && proto == corev1.ProtocolTCP && port == 8000; got != want {
						t.Fatalf("%s %d from the frontend: %v; want %v", proto, port, got, want)
					}
				}
			}
		})
	}
}
