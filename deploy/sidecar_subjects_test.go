package deploy_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// subjectsRule is what the chart's sidecar-subjects policy names in its
// refusals.
const subjectsRule = "rule: only a ServiceAccount of the binding's own namespace may hold a handoff sidecar's rights"

// TestOnlyServiceAccountsHoldTheSidecarsRights: the chart's self-service
// objects, pod-bound policies and sidecar-subjects policy (as helm template
// renders them, with one rbac.sidecarBindings entry) on a real apiserver
// with kube-controller-manager's ClusterRole aggregation and EndpointSlice
// controller. A namespace's admin (the built-in admin, holding bind on
// handoff-sidecar by aggregation) is refused a RoleBinding of
// handoff-sidecar to a User, a Group or another namespace's service
// account, with the rule's message, and so is an update that adds a User
// to an accepted one; a cluster admin is refused a User on the chart's
// Role of rbac.sidecarBindings. A User bound to handoff-sidecar by a
// RoleBinding that slipped in before the policy was installed is refused
// every write (its pods/status patch, an Event, a Lease): it tried to set a
// pod's IP and Ready, and no EndpointSlice of the Service that selects the
// pod ever showed that address, while a kubelet's status write of another
// pod showed up in it. A sidecar's pod-bound token still writes its phase.
func TestOnlyServiceAccountsHoldTheSidecarsRights(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	stopKCM, err := env.StartControllerManager("clusterrole-aggregation", "endpointslice")
	if err != nil {
		t.Fatal(err)
	}
	defer stopKCM()
	team, other, bound := env.Namespace(t), env.Namespace(t), env.Namespace(t)
	admin := env.Client

	render := func(files ...string) []byte {
		args := []string{"template", "handoff", "../charts/handoff", "--namespace", "handoff", "--kube-version", charttest.KubeVersion,
			"--set", "rbac.sidecarBindings[0].namespace=" + bound, "--set", "rbac.sidecarBindings[0].serviceAccount=orders",
			"--set", "rbac.sidecarBindings[0].leases={orders-leader}"}
		for _, f := range files {
			args = append(args, "--show-only", "templates/"+f)
		}
		return helm(t, args...)
	}
	charttest.Create(t, env.Config, charttest.Decode(t, render("sidecar-self-service.yaml", "sidecar-pod-policy.yaml", "sidecar-rbac.yaml")))

	// A binding that slipped in before the subjects policy: the ClusterRole
	// bound to a person.
	const mallory = "mallory"
	if _, err := admin.RbacV1().RoleBindings(team).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "old-binding"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "handoff-sidecar"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: mallory}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	policy := charttest.Decode(t, render("sidecar-bind-policy.yaml"))
	if len(policy) != 2 || policy[0].GetName() != "handoff-sidecar-subjects" {
		t.Fatalf("sidecar-bind-policy.yaml renders %d objects; want the policy handoff-sidecar-subjects and its binding", len(policy))
	}
	charttest.Create(t, env.Config, policy)

	// The team's one right: admin of its namespace.
	const user = "team-admin"
	if _, err := admin.RbacV1().RoleBindings(team).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "team-admin"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "admin"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	asTeamCfg := rest.CopyConfig(env.Config)
	asTeamCfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	asTeam := kubernetes.NewForConfigOrDie(asTeamCfg)
	kubetest.WaitFor(t, 30*time.Second, "the team admin's right to bind handoff-sidecar", func() bool {
		r, err := asTeam.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: team, Verb: "bind", Group: rbacv1.GroupName, Resource: "clusterroles", Name: "handoff-sidecar"}}}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
	binding := func(name string, s ...rbacv1.Subject) *rbacv1.RoleBinding {
		meta := metav1.ObjectMeta{Name: name}
		if strings.HasSuffix(name, "-") {
			meta = metav1.ObjectMeta{GenerateName: name}
		}
		return &rbacv1.RoleBinding{ObjectMeta: meta,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "handoff-sidecar"}, Subjects: s}
	}
	sa := func(ns, name string) rbacv1.Subject {
		return rbacv1.Subject{Kind: "ServiceAccount", Namespace: ns, Name: name}
	}
	refused := func(t *testing.T, what string, err error, want ...string) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v; want Forbidden", what, err)
			return
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v; want the message to say %q", what, err, w)
			}
		}
	}

	t.Run("a namespace admin binds the sidecar's rights to a service account of its namespace alone", func(t *testing.T) {
		// The policy takes effect asynchronously.
		kubetest.WaitFor(t, 15*time.Second, "the sidecar-subjects policy to take effect", func() bool {
			_, err := asTeam.RbacV1().RoleBindings(team).Create(ctx, binding("probe-", rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: "User", Name: "probe"}), metav1.CreateOptions{})
			return apierrors.IsForbidden(err) && strings.Contains(err.Error(), subjectsRule)
		})
		for _, tc := range []struct {
			what    string
			subject rbacv1.Subject
			named   string
		}{
			{"a User", rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: "User", Name: mallory}, "User " + mallory},
			{"a Group", rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: "Group", Name: "system:authenticated"}, "Group system:authenticated"},
			{"a ServiceAccount of another namespace", sa(other, "orders"), "ServiceAccount " + other + "/orders"},
		} {
			_, err := asTeam.RbacV1().RoleBindings(team).Create(ctx, binding("to-subject", sa(team, "orders"), tc.subject), metav1.CreateOptions{})
			refused(t, "handoff-sidecar bound to "+tc.what, err, subjectsRule, "RoleBinding "+team+"/to-subject binds ClusterRole handoff-sidecar", "refused: "+tc.named)
		}
		rb, err := asTeam.RbacV1().RoleBindings(team).Create(ctx, binding("orders", sa(team, "orders")), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("handoff-sidecar bound to a ServiceAccount of its namespace: %v", err)
		}
		rb.Subjects = append(rb.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: "User", Name: mallory})
		_, err = asTeam.RbacV1().RoleBindings(team).Update(ctx, rb, metav1.UpdateOptions{})
		refused(t, "a User added to an accepted RoleBinding", err, subjectsRule, "refused: User "+mallory)
		// The Role the chart makes for rbac.sidecarBindings: even a cluster
		// admin is refused a person on it.
		_, err = admin.RbacV1().RoleBindings(bound).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "orders-by-hand"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "handoff-sidecar-orders"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: mallory}}}, metav1.CreateOptions{})
		refused(t, "the chart's Role handoff-sidecar-orders bound to a User", err, subjectsRule, "binds Role handoff-sidecar-orders")
		_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "handoff-sidecar-everywhere"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "handoff-sidecar"},
			Subjects: []rbacv1.Subject{sa(team, "orders")}}, metav1.CreateOptions{})
		refused(t, "a ClusterRoleBinding of handoff-sidecar by a cluster admin", err, subjectsRule, "across the cluster")
	})

	// A Service over two pods on a node; pod B is the kubelet's, running and
	// ready at 10.0.0.2 once the attack is over.
	const node, evil, genuine = "vap-node", "10.6.6.6", "10.0.0.2"
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}) }()
	if _, err := admin.CoreV1().Services(team).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	newPod := func(name string) *corev1.Pod {
		p, err := admin.CoreV1().Pods(team).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "web", Image: "web:1"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	podA, podB := newPod("web-a"), newPod("web-b")
	sliceWatch, err := admin.DiscoveryV1().EndpointSlices(team).Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
	if err != nil {
		t.Fatal(err)
	}
	defer sliceWatch.Stop()
	runningAt := func(ip string) []byte {
		now := metav1.Now()
		b, _ := json.Marshal(map[string]any{"status": map[string]any{"phase": "Running", "podIP": ip, "podIPs": []any{map[string]any{"ip": ip}},
			"conditions": []any{map[string]any{"type": "Ready", "status": "True", "lastTransitionTime": now}}}})
		return b
	}

	asMallory := func() *kubernetes.Clientset {
		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: mallory, Groups: []string{"system:authenticated"}}
		return kubernetes.NewForConfigOrDie(cfg)
	}()
	t.Run("a User bound by an old binding is refused every write", func(t *testing.T) {
		// RBAC allows it: the old binding holds.
		kubetest.WaitFor(t, 15*time.Second, "mallory's right to patch pods/status by the old binding", func() bool {
			r, err := asMallory.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: team, Verb: "patch", Resource: "pods", Subresource: "status"}}}, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed
		})
		why := []string{"writes only with the token of one of its pods", mallory + " is not a service account of namespace " + team}
		for _, p := range []*corev1.Pod{podA, podB} {
			_, err := asMallory.CoreV1().Pods(team).Patch(ctx, p.Name, types.StrategicMergePatchType, runningAt(evil), metav1.PatchOptions{}, "status")
			refused(t, "mallory sets the IP and Ready of pod "+p.Name, err, why...)
		}
		_, err = asMallory.CoreV1().Events(team).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "x."},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: team, Name: podA.Name, UID: podA.UID},
			Reason:         "X", Message: "x", Type: corev1.EventTypeNormal}, metav1.CreateOptions{})
		refused(t, "mallory records an Event", err, why...)
		_, err = asMallory.CoordinationV1().Leases(team).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
		// Refused by the pod-bound Lease policy and by the lease grants
		// (mallory holds no Lease by name): either may answer first.
		wantForbidden(t, "mallory creates a Lease", err)
	})

	t.Run("no EndpointSlice ever shows the address mallory wrote", func(t *testing.T) {
		// The kubelet's write (the admin's here): pod B running and ready.
		if _, err := admin.CoreV1().Pods(team).Patch(ctx, podB.Name, types.StrategicMergePatchType, runningAt(genuine), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(60 * time.Second)
		for {
			select {
			case ev := <-sliceWatch.ResultChan():
				s, ok := ev.Object.(*discoveryv1.EndpointSlice)
				if !ok || ev.Type == watch.Deleted {
					continue
				}
				var seen []string
				for _, e := range s.Endpoints {
					seen = append(seen, e.Addresses...)
				}
				if slices.Contains(seen, evil) {
					t.Fatalf("EndpointSlice %s shows %s, the address mallory wrote: %v", s.Name, evil, seen)
				}
				if slices.Contains(seen, genuine) {
					a, err := admin.CoreV1().Pods(team).Get(ctx, podA.Name, metav1.GetOptions{})
					if err != nil || a.Status.PodIP != "" || a.Status.Phase == corev1.PodRunning {
						t.Errorf("pod A after the attack: IP %q, phase %q (%v); want neither set", a.Status.PodIP, a.Status.Phase, err)
					}
					return
				}
			case <-deadline:
				t.Fatalf("no EndpointSlice of Service web showed pod B's %s within 60 s: is the EndpointSlice controller running?", genuine)
			}
		}
	})

	t.Run("a sidecar's pod-bound token still writes its phase", func(t *testing.T) {
		if _, err := asTeam.RbacV1().RoleBindings(team).Get(ctx, "orders", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		asA := kubernetes.NewForConfigOrDie(impersonate(env.Config, team, "orders", podA.Name, string(podA.UID)))
		b, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{map[string]any{
			"type": "handoff.dev/Coordinating", "status": "True", "reason": "Running", "lastTransitionTime": metav1.Now()}}}})
		kubetest.WaitFor(t, 15*time.Second, "the sidecar's RoleBinding to take effect", func() bool {
			_, err := asA.CoreV1().Pods(team).Patch(ctx, podA.Name, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status")
			return err == nil
		})
		_, err := asA.CoreV1().Pods(team).Patch(ctx, podA.Name, types.StrategicMergePatchType, runningAt(evil), metav1.PatchOptions{}, "status")
		refused(t, "the sidecar's token sets its pod's IP and Ready", err, "may change only the conditions handoff.dev/Coordinating and handoff.dev/Shards of pod "+podA.Name)
	})
}
