package deploy_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/leaderelection"
)

// TestSidecarRoleHoldsOnlyItsOwnLeases applies the chart's sidecar RBAC and
// Lease name policy for one workload, exactly as helm template renders
// them, to a real apiserver (RBAC authorization, as envtest starts it) and
// acts as that workload's service account by impersonation: its pods'
// sidecars can take, renew and release the workload's Lease through
// handoff's own Elector (whose standby lists and watches the Lease with a
// metadata.name field selector), and are forbidden to read, write or watch
// another Lease of their namespace, to create one, and any Lease of another
// namespace.
func TestSidecarRoleHoldsOnlyItsOwnLeases(t *testing.T) {
	charttest.Tool(t, "helm") // skips outside CI (and under -short) without helm
	env := kubetest.Get(t)
	ctx := context.Background()
	ns, otherNS := env.Namespace(t), env.Namespace(t)
	const sa, own, other = "orders", "orders-leader", "mail-leader"

	// Another workload's Lease in the same namespace, and one by the same
	// name in another namespace, held by someone else.
	for _, n := range []struct{ ns, name string }{{ns, other}, {otherNS, own}} {
		_, err := env.Client.CoordinationV1().Leases(n.ns).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.name},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("someone-else"), LeaseDurationSeconds: ptr.To[int32](3600)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}

	// A second workload of the namespace only drains: it holds no Lease.
	rendered := renderSidecar(t, `[{"namespace":"`+ns+`","serviceAccount":"`+sa+`","leases":["`+own+`"]},{"namespace":"`+ns+`","serviceAccount":"mail","leases":[]}]`)
	applyAll(t, env.Config, rendered, 2, 5) // 5: the pod-bound Leases, Events and status, the Lease names, the sidecar subjects

	user := "system:serviceaccount:" + ns + ":" + sa
	cfg := impersonate(env.Config, ns, sa, "pod-a", "uid-a")
	asSA := kubernetes.NewForConfigOrDie(cfg)
	asPodB := kubernetes.NewForConfigOrDie(impersonate(env.Config, ns, sa, "pod-b", "uid-b"))
	// The RBAC authorizer sees new roles through its informers: wait until
	// it grants the service account its own Lease.
	kubetest.WaitFor(t, 10*time.Second, "the Role and RoleBinding to take effect", func() bool {
		r, err := asSA.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: own}},
		}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
	// The admission policy is compiled and served asynchronously too: wait
	// until it refuses a create of a Lease the service account is not
	// listed for (those created before are in a namespace of the test's).
	probes := 0
	kubetest.WaitFor(t, 10*time.Second, "the Lease name policy to take effect", func() bool {
		probes++
		_, err := asSA.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("probe-%d", probes)}}, metav1.CreateOptions{})
		return apierrors.IsForbidden(err)
	})

	t.Run("takes, renews and releases its own Lease", func(t *testing.T) {
		leases := &forbiddenLog{LeasesGetter: asSA.CoordinationV1()}
		holder := runElector(t, leases, ns, own, "pod-a_uid-a")
		leasesB := &forbiddenLog{LeasesGetter: asPodB.CoordinationV1()}
		// Create (the Lease does not exist yet), then renewals (updates) at
		// the retry period.
		kubetest.WaitFor(t, 15*time.Second, "pod-a to take and renew "+own, func() bool {
			l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, own, metav1.GetOptions{})
			return err == nil && holder.terms() > 0 && ptr.Deref(l.Spec.HolderIdentity, "") == "pod-a_uid-a" &&
				l.Spec.RenewTime.Sub(l.Spec.AcquireTime.Time) >= time.Second
		})
		// A standby, whose Gets wait on its field-selected list and watch.
		standby := runElector(t, leasesB, ns, own, "pod-b_uid-b")
		holder.stop()
		if !holder.e.Released() {
			t.Errorf("pod-a did not release %s: %v", own, holder.e.ReleaseErr())
		}
		kubetest.WaitFor(t, 15*time.Second, "pod-b to take "+own+" after the release", func() bool { return standby.terms() >= 1 })
		if errs := append(leases.errors(), leasesB.errors()...); len(errs) > 0 {
			t.Errorf("the electors met %d Forbidden answers; the first: %v", len(errs), errs[0])
		}
	})

	t.Run("lists and watches its own Lease by name", func(t *testing.T) {
		byName := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", own).String()}
		if _, err := asSA.CoordinationV1().Leases(ns).List(ctx, byName); err != nil {
			t.Errorf("list %s by field selector: %v", own, err)
		}
		w, err := asSA.CoordinationV1().Leases(ns).Watch(ctx, byName)
		if err != nil {
			t.Errorf("watch %s by field selector: %v", own, err)
		} else {
			w.Stop()
		}
		// Without the selector the request names no Lease: RBAC cannot
		// grant it by name.
		if _, err := asSA.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("list every Lease of its namespace: %v; want Forbidden", err)
		}
	})

	t.Run("is forbidden another workload's Lease", func(t *testing.T) {
		forbidden(t, "another Lease", asSA.CoordinationV1().Leases(ns), ns, other)
	})

	t.Run("is forbidden its Lease's name in another namespace", func(t *testing.T) {
		leases := asSA.CoordinationV1().Leases(otherNS)
		forbidden(t, "another namespace", leases, otherNS, own)
		_, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("create a Lease in another namespace: %v; want Forbidden", err)
		}
	})

	t.Run("is refused creating a Lease it is not listed for", func(t *testing.T) {
		// RBAC cannot limit create by name (the name is in the body): the
		// chart's ValidatingAdmissionPolicy does, so the service account
		// cannot pin another workload's Lease before that one creates it.
		_, err := asSA.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "unlisted"},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("pod-a_uid-a"), LeaseDurationSeconds: ptr.To[int32](15)},
		}, metav1.CreateOptions{})
		want := "handoff: " + user + " may create only the Leases " + own + " (rbac.sidecarBindings of the handoff chart), not unlisted"
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("create Lease unlisted: %v; want Forbidden: %s", err, want)
		}
		// The policy is about the listed service accounts only.
		if _, err := env.Client.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "unlisted"}}, metav1.CreateOptions{}); err != nil {
			t.Errorf("create Lease unlisted as another user: %v", err)
		}
	})

	t.Run("a workload with no Leases may create none", func(t *testing.T) {
		drainOnly := impersonate(env.Config, ns, "mail", "mail-0", "uid-mail-0")
		_, err := kubernetes.NewForConfigOrDie(drainOnly).CoordinationV1().Leases(ns).Create(ctx,
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "mail-new"}}, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("create a Lease as the drain-only service account: %v; want Forbidden", err)
		}
	})

	t.Run("reads its Pod and records Events", func(t *testing.T) {
		pod := env.Pod(t, ns, "orders-0", 30)
		asSA := kubernetes.NewForConfigOrDie(impersonate(env.Config, ns, sa, pod.Name, string(pod.UID)))
		if _, err := asSA.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("get its Pod: %v", err)
		}
		w, err := asSA.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + pod.Name})
		if err != nil {
			t.Errorf("watch its Pod: %v", err)
		} else {
			w.Stop()
		}
		_, err = asSA.CoreV1().Events(ns).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: "orders-0."},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod.Name, UID: pod.UID},
			Reason:         "DrainStarted", Message: "test", Type: corev1.EventTypeNormal,
			Source: corev1.EventSource{Component: "handoff"},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("create an Event: %v", err)
		}
		if _, err := asSA.CoreV1().Pods(otherNS).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("list the pods of another namespace: %v; want Forbidden", err)
		}
	})
}

// renderSidecar renders what the chart gives the sidecars of the
// rbac.sidecarBindings in JSON: every templates/sidecar-*.yaml (RBAC and
// admission policies), with the chart's other values at their defaults.
func renderSidecar(t *testing.T, bindings string) []byte {
	t.Helper()
	files, err := filepath.Glob("../charts/handoff/templates/sidecar-*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("the chart's sidecar templates: %v, %v", files, err)
	}
	// Self-service (sidecar-self-service.yaml, TestSelfServiceSidecar) off:
	// these are the listed workloads' objects alone.
	args := []string{"template", "handoff", "../charts/handoff", "--namespace", "handoff", "--kube-version", "1.35.0", "--set-json", "rbac.sidecarBindings=" + bindings, "--set", "rbac.selfService=false"}
	for _, f := range files {
		if filepath.Base(f) == "sidecar-self-service.yaml" {
			continue
		}
		args = append(args, "--show-only", "templates/"+filepath.Base(f))
	}
	return helm(t, args...)
}

// impersonate is cfg acting as service account ns/sa through the token
// of pod (name, uid): the user, groups and extra the API server gives a
// token bound to a pod (authentication.kubernetes.io/pod-name and
// pod-uid), as injection mounts into the sidecar. Empty name and uid: a
// token bound to no pod (a legacy Secret's, or a TokenRequest's for the
// service account alone).
func impersonate(cfg *rest.Config, ns, sa, name, uid string) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	if name != "" {
		out.Impersonate.Extra = map[string][]string{podNameClaim: {name}, podUIDClaim: {uid}}
	}
	return out
}

// The user extra keys of a token bound to a pod.
const (
	podNameClaim = "authentication.kubernetes.io/pod-name"
	podUIDClaim  = "authentication.kubernetes.io/pod-uid"
)

// forbidden asserts that every Lease call the sidecar makes, on Lease name
// in leases, is refused with 403 Forbidden. The update is of the Lease as
// the admin reads it, taken over, so only authorization can refuse it.
func forbidden(t *testing.T, what string, leases coordinationv1client.LeaseInterface, ns, name string) {
	t.Helper()
	ctx := context.Background()
	env := kubetest.Get(t)
	byName := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
	_, getErr := leases.Get(ctx, name, metav1.GetOptions{})
	_, listErr := leases.List(ctx, byName)
	w, watchErr := leases.Watch(ctx, byName)
	if w != nil {
		w.Stop()
	}
	var updateErr error
	if lease, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else {
		lease.Spec.HolderIdentity = ptr.To("pod-a_uid-a")
		_, updateErr = leases.Update(ctx, lease, metav1.UpdateOptions{})
	}
	for verb, err := range map[string]error{"get": getErr, "list": listErr, "watch": watchErr, "update": updateErr} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %s Lease %s: %v; want Forbidden", what, verb, name, err)
		}
	}
}

// applyAll creates every object of the YAML stream, as the admin: the
// sidecar RBAC of bindings rbac.sidecarBindings entries and policies
// admission policies (the Lease name policy, and the Lease and Event
// policies of sidecar-pod-policy.yaml), each with its binding. (A policy
// that does not compile refuses every create it matches, with the compile
// error: the tests of their messages show they compile.)
func applyAll(t *testing.T, cfg *rest.Config, stream []byte, bindings, policies int) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(cfg)
	kinds := map[string]int{}
	for _, obj := range charttest.Decode(t, stream) {
		gvk := obj.GroupVersionKind()
		res, ok := sidecarKinds[gvk.Kind]
		if !ok || res.Group != gvk.Group {
			t.Fatalf("the sidecar RBAC renders a %s %s; want only Roles, RoleBindings and admission policies", gvk.Kind, obj.GetName())
		}
		res.Version = gvk.Version
		if _, err := dyn.Resource(res).Namespace(obj.GetNamespace()).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s %s/%s: %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
		if obj.GetNamespace() == "" {
			t.Cleanup(func() { _ = dyn.Resource(res).Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}) })
		}
		kinds[gvk.Kind]++
	}
	want := map[string]int{"Role": bindings, "RoleBinding": bindings, "ValidatingAdmissionPolicy": policies, "ValidatingAdmissionPolicyBinding": policies}
	if !maps.Equal(kinds, want) {
		t.Fatalf("the sidecar RBAC renders %v; want %v", kinds, want)
	}
}

// sidecarKinds are what the chart renders for one rbac.sidecarBindings entry.
var sidecarKinds = map[string]schema.GroupVersionResource{
	"Role":                             {Group: "rbac.authorization.k8s.io", Resource: "roles"},
	"RoleBinding":                      {Group: "rbac.authorization.k8s.io", Resource: "rolebindings"},
	"ValidatingAdmissionPolicy":        {Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicies"},
	"ValidatingAdmissionPolicyBinding": {Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicybindings"},
}

// forbiddenLog is a Leases client that keeps every Forbidden answer.
type forbiddenLog struct {
	coordinationv1client.LeasesGetter
	mu   sync.Mutex
	errs []error
}

func (f *forbiddenLog) note(err error) {
	if apierrors.IsForbidden(err) {
		f.mu.Lock()
		f.errs = append(f.errs, err)
		f.mu.Unlock()
	}
}

func (f *forbiddenLog) errors() []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]error(nil), f.errs...)
}

func (f *forbiddenLog) Leases(ns string) coordinationv1client.LeaseInterface {
	return forbiddenLogClient{LeaseInterface: f.LeasesGetter.Leases(ns), f: f}
}

type forbiddenLogClient struct {
	coordinationv1client.LeaseInterface
	f *forbiddenLog
}

func (c forbiddenLogClient) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	out, err := c.LeaseInterface.Get(ctx, name, o)
	c.f.note(err)
	return out, err
}

func (c forbiddenLogClient) List(ctx context.Context, o metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	out, err := c.LeaseInterface.List(ctx, o)
	c.f.note(err)
	return out, err
}

func (c forbiddenLogClient) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	out, err := c.LeaseInterface.Watch(ctx, o)
	c.f.note(err)
	return out, err
}

func (c forbiddenLogClient) Create(ctx context.Context, l *coordinationv1.Lease, o metav1.CreateOptions) (*coordinationv1.Lease, error) {
	out, err := c.LeaseInterface.Create(ctx, l, o)
	c.f.note(err)
	return out, err
}

func (c forbiddenLogClient) Update(ctx context.Context, l *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	out, err := c.LeaseInterface.Update(ctx, l, o)
	c.f.note(err)
	return out, err
}

// elector is one handoff Elector run by the test.
type elector struct {
	e      *leaderelection.Elector
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	n      int // OnTerm calls: the acquisition and each renewal
}

func (c *elector) terms() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// stop ends Run, which releases the Lease if held, and waits for it.
func (c *elector) stop() { c.cancel(); <-c.done }

func runElector(t *testing.T, leases coordinationv1client.LeasesGetter, ns, name, identity string) *elector {
	t.Helper()
	c := &elector{done: make(chan struct{})}
	e, err := leaderelection.New(leaderelection.Config{
		Leases: leases, Namespace: ns, Name: name, Identity: identity,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 250 * time.Millisecond,
		Logger: testr.New(t),
	}, leaderelection.Callbacks{OnTerm: func(leaderelection.Term) { c.mu.Lock(); c.n++; c.mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.e, c.cancel = e, cancel
	go func() { defer close(c.done); e.Run(ctx) }()
	t.Cleanup(c.stop)
	return c
}
