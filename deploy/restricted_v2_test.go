package deploy_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// The range of user ids a restricted-v2-like namespace allows, as
// OpenShift's annotation openshift.io/sa.scc.uid-range gives one
// (1000680000/10000): any other user id, 65532 included, is refused.
const assignedUIDs = "1000680000 && %s <= 1000689999"

// restrictedV2Like is what OpenShift's restricted-v2 SCC refuses that Pod
// Security's restricted level does not: a user id outside the namespace's
// range, set on the pod or on any container (it assigns one itself to
// those that set none, which a validating policy cannot do; an unset id
// is what a chart must produce for it). Pod Security's restricted level
// (the namespace's label) covers the rest: runAsNonRoot, no privilege
// escalation, capabilities dropped, seccomp.
func restrictedV2Like(name string) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	inRange := func(v string) string {
		return fmt.Sprintf("(!has(%[1]s.securityContext) || !has(%[1]s.securityContext.runAsUser) || (%[1]s.securityContext.runAsUser >= %[2]s))",
			v, fmt.Sprintf(assignedUIDs, v+".securityContext.runAsUser"))
	}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}}},
			Validations: []admissionregistrationv1.Validation{
				{Expression: inRange("object.spec"), Message: "restricted-v2-like: the pod's runAsUser is outside the namespace's range 1000680000/10000"},
				{Expression: "object.spec.containers.all(c, " + inRange("c") + ")", Message: "restricted-v2-like: a container's runAsUser is outside the namespace's range 1000680000/10000"},
				{Expression: "!has(object.spec.initContainers) || object.spec.initContainers.all(c, " + inRange("c") + ")", Message: "restricted-v2-like: an init container's runAsUser is outside the namespace's range 1000680000/10000"},
			},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"example.com/scc": name}}},
		},
	}
	return policy, binding
}

// Under a restricted-v2-like policy (Pod Security restricted, and a
// policy that refuses any user id outside the namespace's range, as
// OpenShift does), the chart installs with the user and group ids left
// out (values null): the webhook's pod is admitted, and so is a worker's
// pod injected by an injector given no ids (--sidecar-run-as-user=""),
// runAsNonRoot true on each of handoff's containers. With the defaults
// (65532) both are refused, naming the id: the policy bites.
func TestChartInstallsUnderARestrictedV2LikePolicy(t *testing.T) {
	needHelm(t)
	env := kubetest.Get(t)
	ctx := context.Background()
	name := fmt.Sprintf("restricted-v2-%d", os.Getpid())
	policy, binding := restrictedV2Like(name)
	vaps := env.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	vapbs := env.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	if _, err := vaps.Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vaps.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	if _, err := vapbs.Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vapbs.Delete(context.Background(), name, metav1.DeleteOptions{}) })

	render := func(values ...string) (*corev1.Namespace, *corev1.Pod) {
		args := []string{"template", "handoff", "../charts/handoff", "--namespace", name, "--kube-version", charttest.KubeVersion,
			"--set", "createNamespace=true", "--show-only", "templates/namespace.yaml", "--show-only", "templates/deployment.yaml"}
		for _, v := range values {
			args = append(args, "-f", v)
		}
		var ns corev1.Namespace
		var d appsv1.Deployment
		for _, obj := range charttest.Decode(t, helm(t, args...)) {
			var into any = &d
			if obj.GetKind() == "Namespace" {
				into = &ns
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, into); err != nil {
				t.Fatal(err)
			}
		}
		ns.Labels["example.com/scc"] = name
		pod := &corev1.Pod{ObjectMeta: d.Spec.Template.ObjectMeta, Spec: d.Spec.Template.Spec}
		pod.Name = "webhook"
		return &ns, pod
	}
	ns, assigned := render("../charts/handoff/tests/values/assigned-ids.yaml")
	if got := ns.Labels["pod-security.kubernetes.io/enforce"]; got != "restricted" {
		t.Fatalf("the chart's Namespace enforces %q; want restricted", got)
	}
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	create := func(p *corev1.Pod) error {
		_, err := env.Client.CoreV1().Pods(name).Create(ctx, p, dryRun)
		return err
	}

	// The API server takes policies up asynchronously: wait until the
	// chart's default pod (65532) is refused by it.
	_, defaults := render()
	kubetest.WaitFor(t, 15*time.Second, "the restricted-v2-like policy to take effect", func() bool {
		err := create(defaults)
		return err != nil && strings.Contains(err.Error(), "restricted-v2-like")
	})
	if err := create(assigned); err != nil {
		t.Errorf("the webhook's pod with the ids left out: %v; want admitted", err)
	}
	for _, c := range assigned.Spec.Containers {
		if c.SecurityContext == nil || !ptr.Deref(c.SecurityContext.RunAsNonRoot, false) || c.SecurityContext.RunAsUser != nil {
			t.Errorf("webhook container %s: securityContext %+v; want runAsNonRoot true and no runAsUser", c.Name, c.SecurityContext)
		}
	}

	// A worker that meets the restricted level, its user left to the
	// platform, injected as the webhook would with each injector setting.
	worker := func(o inject.Options) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "orders", Annotations: map[string]string{inject.AnnotationInject: "true"}},
			Spec: corev1.PodSpec{
				SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
				Containers: []corev1.Container{{Name: "worker", Image: "orders:1", SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
			},
		}
		o.Image = "handoff-sidecar:test"
		if res, err := inject.Pod(&p.ObjectMeta, &p.Spec, o); err != nil || res != inject.Injected {
			t.Fatalf("inject: %s, %v", res, err)
		}
		return p
	}
	omitted := worker(inject.Options{RunAsUser: inject.OmitID, RunAsGroup: inject.OmitID})
	if err := create(omitted); err != nil {
		t.Errorf("an injected worker with the sidecar's ids left out: %v; want admitted", err)
	}
	for _, c := range omitted.Spec.InitContainers {
		if c.SecurityContext == nil || !ptr.Deref(c.SecurityContext.RunAsNonRoot, false) || c.SecurityContext.RunAsUser != nil {
			t.Errorf("injected %s: securityContext %+v; want runAsNonRoot true and no runAsUser", c.Name, c.SecurityContext)
		}
	}
	if err := create(worker(inject.Options{})); err == nil || !strings.Contains(err.Error(), "init container's runAsUser is outside") {
		t.Errorf("an injected worker with the default ids (65532): %v; want refused by the restricted-v2-like policy", err)
	}
}
