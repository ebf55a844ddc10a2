package deploy_test

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/handoff-dev/handoff/internal/charttest"
)

// The chart as a dependency: testdata/umbrella, a platform's umbrella chart
// that depends on charts/handoff by file:// and sets global values (its
// registry mirror and pull secret, and one handoff ignores), handoff's
// knobs and its switch (condition: handoff.enabled), builds its
// dependency, lints strictly, renders (nothing of handoff when switched
// off), and every object
// it renders is accepted by a real apiserver (a server-side dry run).
func TestChartAsASubchart(t *testing.T) {
	const umbrella = "testdata/umbrella"
	helm(t, "dependency", "update", "--skip-refresh", umbrella)
	helm(t, "lint", "--strict", umbrella, "--kube-version", charttest.KubeVersion)
	objs := charttest.Decode(t, helm(t, "template", "platform", umbrella, "--namespace", "platform", "--kube-version", charttest.KubeVersion))

	var webhook *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			webhook = o
		}
		// commonLabels, given in the umbrella's handoff values, on every
		// object of the subchart.
		if o.GetKind() != "ConfigMap" && o.GetLabels()["platform.example.com/team"] != "platform" {
			t.Errorf("%s %s: no commonLabels: %v", o.GetKind(), o.GetName(), o.GetLabels())
		}
	}
	if webhook == nil {
		t.Fatal("the umbrella renders no webhook Deployment")
	}
	containers, _, _ := unstructured.NestedSlice(webhook.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	if img, _ := c["image"].(string); len(img) < 40 || img[:40] != "mirror.platform.internal/handoff-dev/han" {
		t.Errorf("webhook image %q; want it from global.imageRegistry mirror.platform.internal", c["image"])
	}
	args, _ := c["args"].([]any)
	if !slices.ContainsFunc(args, func(a any) bool {
		s, _ := a.(string)
		return len(s) > 58 && s[:58] == "--image=mirror.platform.internal/handoff-dev/handoff-sidec"
	}) {
		t.Errorf("webhook args %v; want --image=mirror.platform.internal/handoff-dev/handoff-sidecar:…", args)
	}
	secrets, _, _ := unstructured.NestedSlice(webhook.Object, "spec", "template", "spec", "imagePullSecrets")
	if len(secrets) != 1 || secrets[0].(map[string]any)["name"] != "mirror-pull" {
		t.Errorf("imagePullSecrets %v; want global.imagePullSecrets' mirror-pull", secrets)
	}
	// The umbrella's switch, dependencies[].condition: handoff.enabled.
	off := charttest.Decode(t, helm(t, "template", "platform", umbrella, "--namespace", "platform", "--kube-version", charttest.KubeVersion, "--set", "handoff.enabled=false"))
	if len(off) != 1 || off[0].GetKind() != "ConfigMap" {
		t.Errorf("handoff.enabled=false rendered %d objects; want the umbrella's ConfigMap alone", len(off))
	}
	kinds := dryRunAll(t, objs)
	if kinds["ConfigMap"] != 1 || kinds["Deployment"] != 1 || kinds["MutatingWebhookConfiguration"] != 1 {
		t.Errorf("the umbrella rendered %v; want its ConfigMap and handoff's Deployment and webhook configuration", kinds)
	}
}

// Every knob of the chart set at once renders objects a real apiserver
// accepts, and lints strictly.
func TestAPIServerAcceptsEveryKnob(t *testing.T) {
	args := []string{"--kube-version", charttest.KubeVersion, "-f", "testdata/every-knob.yaml"}
	helm(t, append([]string{"lint", "--strict", "../charts/handoff"}, args...)...)
	objs := charttest.Decode(t, helm(t, append([]string{"template", "knobs", "../charts/handoff", "--namespace", "knobs"}, args...)...))
	for _, o := range objs {
		// commonLabels on every object; fullnameOverride in every name.
		if o.GetLabels()["team"] != "platform" {
			t.Errorf("%s %s: no commonLabels: %v", o.GetKind(), o.GetName(), o.GetLabels())
		}
		if o.GetKind() != "Namespace" && !strings.HasPrefix(o.GetName(), "platform-hf") {
			t.Errorf("%s %s: not named after fullnameOverride platform-hf", o.GetKind(), o.GetName())
		}
	}
	if kinds := dryRunAll(t, objs); kinds["Deployment"] != 1 || kinds["Role"] != 3 || kinds["ValidatingAdmissionPolicy"] < 4 {
		t.Errorf("rendered %v; want one Deployment, three Roles (the webhook's, the two workloads') and the sidecar policies", kinds)
	}
}

// Both charts as subcharts of one umbrella (testdata/umbrella-workload:
// handoff, and handoff-workload aliased orders), no names given: the
// workload's RoleBinding binds the ClusterRole the platform subchart
// renders (<release>-handoff-sidecar, not the handoff-sidecar of a
// platform release named handoff), every ClusterRole any binding names is
// rendered there, it lints strictly, and a real apiserver accepts it.
func TestWorkloadChartBesideThePlatformInAnUmbrella(t *testing.T) {
	const umbrella = "testdata/umbrella-workload"
	helm(t, "dependency", "update", "--skip-refresh", umbrella)
	helm(t, "lint", "--strict", umbrella, "--kube-version", charttest.KubeVersion)
	objs := charttest.Decode(t, helm(t, "template", "platform", umbrella, "--namespace", "platform", "--kube-version", charttest.KubeVersion))
	clusterRoles := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" {
			clusterRoles[o.GetName()] = true
		}
	}
	var workloadBinding bool
	for _, o := range objs {
		if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		kind, _, _ := unstructured.NestedString(o.Object, "roleRef", "kind")
		name, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
		if kind == "ClusterRole" && !clusterRoles[name] && !strings.HasPrefix(name, "system:") {
			t.Errorf("%s %s binds the ClusterRole %s, which the umbrella does not render (it renders %v)", o.GetKind(), o.GetName(), name, clusterRoles)
		}
		if o.GetKind() == "RoleBinding" && strings.HasPrefix(o.GetName(), "handoff-sidecar-") {
			workloadBinding = true
			if name != "platform-handoff-sidecar" {
				t.Errorf("the workload's RoleBinding binds %s; want platform-handoff-sidecar, the platform subchart's", name)
			}
			if sa, _, _ := unstructured.NestedSlice(o.Object, "subjects"); len(sa) != 1 || sa[0].(map[string]any)["name"] != "platform-orders" {
				t.Errorf("the workload's RoleBinding subjects %v; want the service account platform-orders", sa)
			}
		}
	}
	if !workloadBinding {
		t.Fatal("the umbrella renders no RoleBinding of the workload subchart")
	}
	kinds := dryRunAll(t, objs)
	if kinds["ServiceAccount"] != 2 || kinds["Deployment"] != 1 {
		t.Errorf("the umbrella rendered %v; want both subcharts' service accounts and the webhook's Deployment", kinds)
	}
}
