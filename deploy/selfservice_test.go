package deploy_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// TestSelfServiceSidecar: an app team enables handoff for its own workload
// with objects in its own namespace, the platform's release unchanged. The
// chart's self-service objects and pod-bound policies (as helm template
// renders them, with no rbac.sidecarBindings) are applied to a real
// apiserver, with kube-controller-manager's ClusterRole aggregation. A user
// who is admin of one namespace alone (the built-in admin ClusterRole, by
// a RoleBinding) creates, by impersonation, what charts/handoff-workload
// renders (the objects docs/install.md lists): its service account, a
// RoleBinding of it to the ClusterRole handoff-sidecar, and a Role and
// RoleBinding that let it hold its Lease by name. It is
// refused the same in another namespace, a binding to cluster-admin or
// across the cluster, and the sidecars' mark in a Role of its own. The service account's
// pod-bound token (the sidecar's) then runs its election and records Events
// about its pod; it is refused a Lease not granted to it, another pod as
// holder, an Event about another pod, a write with a token bound to no pod,
// and every Lease and pod of another namespace. A service account with a
// wildcard (cluster-admin) is not taken for a sidecar.
func TestSelfServiceSidecar(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	stopKCM, err := env.StartControllerManager("clusterrole-aggregation")
	if err != nil {
		t.Fatal(err)
	}
	defer stopKCM()

	rendered := helm(t, "template", "handoff", "../charts/handoff", "--namespace", "handoff", "--kube-version", charttest.KubeVersion,
		"--show-only", "templates/sidecar-self-service.yaml", "--show-only", "templates/sidecar-pod-policy.yaml")
	created := charttest.Create(t, env.Config, charttest.Decode(t, rendered))
	if n, p := len(created["ClusterRole"]), len(created["ValidatingAdmissionPolicy"]); n != 2 || p != 4 {
		t.Fatalf("self-service renders %d ClusterRoles and %d admission policies; want 2 and 4 (lease grants, pod-bound Leases, Events and pod status)", n, p)
	}

	team, other := env.Namespace(t), env.Namespace(t)
	const sa, lease, user = "orders", "orders-leader", "team-admin"
	admin := env.Client
	// The team's one right: admin of its namespace.
	if _, err := admin.RbacV1().RoleBindings(team).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "team-admin"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "admin"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitFor(t, 30*time.Second, "kube-controller-manager to aggregate handoff-sidecar-grant into admin", func() bool {
		r, err := admin.RbacV1().ClusterRoles().Get(ctx, "admin", metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(r.Rules, func(p rbacv1.PolicyRule) bool { return slices.Contains(p.ResourceNames, "handoff-sidecar") })
	})
	asTeamCfg := rest.CopyConfig(env.Config)
	asTeamCfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	asTeam := kubernetes.NewForConfigOrDie(asTeamCfg)

	// What the team creates: charts/handoff-workload, docs/install.md's objects.
	workload := func(ns string) []*unstructured.Unstructured {
		return charttest.Decode(t, helm(t, "template", "orders-handoff", "../charts/handoff-workload", "--namespace", ns, "--kube-version", charttest.KubeVersion,
			"--set", "serviceAccount.name="+sa, "--set", "leases={"+lease+"}"))
	}
	objs := workload(team)
	// The RBAC authorizer takes the aggregated rules asynchronously.
	kubetest.WaitFor(t, 15*time.Second, "the team admin's right to bind handoff-sidecar", func() bool {
		r, err := asTeam.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: team, Verb: "bind", Group: rbacv1.GroupName, Resource: "clusterroles", Name: "handoff-sidecar"}}}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
	if kinds := charttest.Create(t, asTeamCfg, objs); len(kinds["ServiceAccount"]) != 1 || len(kinds["RoleBinding"]) != 2 || len(kinds["Role"]) != 1 {
		t.Fatalf("charts/handoff-workload rendered %v; want a ServiceAccount, a Role and two RoleBindings", kinds)
	}
	bindSidecar := func(role string) *rbacv1.RoleBinding {
		return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bind-" + role},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: team}}}
	}

	t.Run("the team admin is refused anything beyond its namespace's sidecars", func(t *testing.T) {
		for _, o := range workload(other) {
			gvk := o.GroupVersionKind()
			r := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: strings.ToLower(gvk.Kind) + "s"}
			_, err := dynamic.NewForConfigOrDie(asTeamCfg).Resource(r).Namespace(other).Create(ctx, o, metav1.CreateOptions{})
			wantForbidden(t, "charts/handoff-workload's "+gvk.Kind+" in another namespace", err)
		}
		_, err := asTeam.RbacV1().RoleBindings(team).Create(ctx, bindSidecar("cluster-admin"), metav1.CreateOptions{})
		wantForbidden(t, "bind cluster-admin in its namespace", err)
		// The mark comes with the ClusterRole alone.
		_, err = asTeam.RbacV1().Roles(team).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "own-mark"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"handoff.dev"}, Resources: []string{"sidecars"}, Verbs: []string{"use"}}}}, metav1.CreateOptions{})
		wantForbidden(t, "a Role of its own making with the sidecars' mark", err)
		_, err = asTeam.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "team-sidecar-everywhere"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "handoff-sidecar"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: team}}}, metav1.CreateOptions{})
		wantForbidden(t, "a ClusterRoleBinding of handoff-sidecar", err)
	})

	podA, podB := env.Pod(t, team, "orders-a", 30), env.Pod(t, team, "orders-b", 30)
	idA, idB := podA.Name+"_"+string(podA.UID), podB.Name+"_"+string(podB.UID)
	asA := kubernetes.NewForConfigOrDie(impersonate(env.Config, team, sa, podA.Name, string(podA.UID)))
	unbound := kubernetes.NewForConfigOrDie(impersonate(env.Config, team, sa, "", ""))
	refA := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: team, Name: podA.Name, UID: podA.UID}
	refB := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: team, Name: podB.Name, UID: podB.UID}
	eventAbout := func(ref corev1.ObjectReference) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe."}, InvolvedObject: ref,
			Reason: "DrainStarted", Message: "test", Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "handoff"}}
	}
	// RBAC and the admission policies take effect asynchronously.
	kubetest.WaitFor(t, 15*time.Second, "the team's RoleBindings and the policies to take effect", func() bool {
		_, own := asA.CoreV1().Events(team).Create(ctx, eventAbout(refA), metav1.CreateOptions{})
		_, other := asA.CoreV1().Events(team).Create(ctx, eventAbout(refB), metav1.CreateOptions{})
		_, notGranted := asA.CoordinationV1().Leases(team).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "not-granted"}}, metav1.CreateOptions{})
		_, otherHolder := asA.CoordinationV1().Leases(team).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lease},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(idB)}}, metav1.CreateOptions{})
		return own == nil && apierrors.IsForbidden(other) && apierrors.IsForbidden(notGranted) && apierrors.IsForbidden(otherHolder)
	})
	refused := func(t *testing.T, what string, err error, want string) {
		t.Helper()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want Forbidden: %s", what, err, want)
		}
	}

	t.Run("its sidecar holds, renews and releases its Lease", func(t *testing.T) {
		leases := &forbiddenLog{LeasesGetter: asA.CoordinationV1()}
		e := runElector(t, leases, team, lease, idA)
		kubetest.WaitFor(t, 15*time.Second, "pod A to take and renew "+lease, func() bool {
			l, err := admin.CoordinationV1().Leases(team).Get(ctx, lease, metav1.GetOptions{})
			return err == nil && e.terms() > 1 && ptr.Deref(l.Spec.HolderIdentity, "") == idA
		})
		e.stop()
		if !e.e.Released() {
			t.Errorf("pod A did not release %s: %v", lease, e.e.ReleaseErr())
		}
		if errs := leases.errors(); len(errs) > 0 {
			t.Errorf("the elector met %d Forbidden answers; the first: %v", len(errs), errs[0])
		}
		if _, err := asA.CoreV1().Pods(team).Get(ctx, podA.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("get its own pod: %v", err)
		}
	})

	t.Run("its sidecar is held to its pod and its Lease", func(t *testing.T) {
		_, err := asA.CoordinationV1().Leases(team).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "payments-leader"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(idA)}}, metav1.CreateOptions{})
		refused(t, "a Lease not granted", err, "may write only the Leases a Role of namespace "+team+" lets it hold (apiGroups [handoff.dev], resources [leases], verbs [hold], resourceNames), not payments-leader")
		l, err := admin.CoordinationV1().Leases(team).Get(ctx, lease, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		l.Spec.HolderIdentity = ptr.To(idB)
		_, err = asA.CoordinationV1().Leases(team).Update(ctx, l, metav1.UpdateOptions{})
		refused(t, "pod B as holder", err, "may name as the holder of Lease "+lease+" only itself, "+idA+", or no one; not "+idB)
		_, err = asA.CoreV1().Events(team).Create(ctx, eventAbout(refB), metav1.CreateOptions{})
		refused(t, "an Event about pod B", err, "may record Events only about its own pod")
		_, err = unbound.CoreV1().Events(team).Create(ctx, eventAbout(refA), metav1.CreateOptions{})
		refused(t, "an Event with a token bound to no pod", err, "writes only with the token of one of its pods")
		if err := asA.CoreV1().Pods(team).Delete(ctx, podB.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("delete pod B: %v; want Forbidden", err)
		}
	})

	t.Run("its sidecar has no rights in another namespace", func(t *testing.T) {
		if _, err := admin.CoordinationV1().Leases(other).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lease}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		forbidden(t, "another namespace's Lease of the same name", asA.CoordinationV1().Leases(other), other, lease)
		_, err := asA.CoordinationV1().Leases(other).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
		wantForbidden(t, "create a Lease in another namespace", err)
		_, err = asA.CoreV1().Pods(other).List(ctx, metav1.ListOptions{})
		wantForbidden(t, "list another namespace's pods", err)
		_, err = asA.CoreV1().Events(other).Create(ctx, eventAbout(refA), metav1.CreateOptions{})
		wantForbidden(t, "an Event in another namespace", err)
	})

	t.Run("a service account with a wildcard is not taken for a sidecar", func(t *testing.T) {
		const ctrl = "operator"
		if _, err := admin.RbacV1().RoleBindings(team).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ctrl},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: ctrl, Namespace: team}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		op := kubernetes.NewForConfigOrDie(impersonate(env.Config, team, ctrl, podB.Name, string(podB.UID)))
		// client-go's own election identity (host name_UUID), a Lease no
		// Role grants by name: none of handoff's policies apply.
		kubetest.WaitFor(t, 15*time.Second, "the operator's RoleBinding to take effect", func() bool {
			_, err := op.CoordinationV1().Leases(team).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "operator-lock"},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("host_0f8c"), LeaseDurationSeconds: ptr.To[int32](86400)}}, metav1.CreateOptions{})
			return err == nil
		})
	})
}

func wantForbidden(t *testing.T, what string, err error) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: %v; want Forbidden", what, err)
	}
}
