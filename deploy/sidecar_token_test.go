package deploy_test

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/leaderelection"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/shard"
)

// TestSidecarTokenActsOnlyForItsOwnPod applies everything the chart gives
// two workloads' sidecars (RBAC and admission policies, as helm template
// renders them) to a real apiserver, and acts as the token injection
// mounts into a sidecar: its workload's service account, bound to one pod
// (the user extra authentication.kubernetes.io/pod-name and pod-uid, which
// impersonation sets as the API server does for a pod-bound token). That
// token records Events about its own pod, reads and watches that pod, and
// runs its real elections (acquire, renew, release, a standby's takeover,
// the leftover release) without one refusal; it is refused an Event about
// another pod, a Lease naming another pod as holder, a Lease duration of a
// day, freeing another pod's Lease, moving the fencing token, giving the
// Lease an owner, any write with a token bound to no pod, and listing pods
// when its workload has no shards.
func TestSidecarTokenActsOnlyForItsOwnPod(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	const sa, lease, sharded = "orders", "orders-leader", "batch"
	rendered := renderSidecar(t, `[{"namespace":"`+ns+`","serviceAccount":"`+sa+`","leases":["`+lease+`"]},`+
		`{"namespace":"`+ns+`","serviceAccount":"`+sharded+`","leases":[],"shards":{"prefix":"batch-","count":2}}]`)
	applyAll(t, env.Config, rendered, 2, 5)

	podA, podB := env.Pod(t, ns, "orders-a", 30), env.Pod(t, ns, "orders-b", 30)
	idA, idB := podA.Name+"_"+string(podA.UID), podB.Name+"_"+string(podB.UID)
	asA := kubernetes.NewForConfigOrDie(impersonate(env.Config, ns, sa, podA.Name, string(podA.UID)))
	asB := kubernetes.NewForConfigOrDie(impersonate(env.Config, ns, sa, podB.Name, string(podB.UID)))
	unbound := kubernetes.NewForConfigOrDie(impersonate(env.Config, ns, sa, "", ""))
	admin := env.Client

	eventAbout := func(ref corev1.ObjectReference) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe."}, InvolvedObject: ref,
			Reason: "DrainStarted", Message: "test", Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "handoff"}}
	}
	refA := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: podA.Name, UID: podA.UID}
	refB := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: podB.Name, UID: podB.UID}
	// The RBAC authorizer and the admission policies take effect
	// asynchronously: wait until pod A may record an Event about itself and
	// is refused one about pod B.
	kubetest.WaitFor(t, 15*time.Second, "the Role and the Event policy to take effect", func() bool {
		_, own := asA.CoreV1().Events(ns).Create(ctx, eventAbout(refA), metav1.CreateOptions{})
		_, other := asA.CoreV1().Events(ns).Create(ctx, eventAbout(refB), metav1.CreateOptions{})
		return own == nil && apierrors.IsForbidden(other)
	})
	kubetest.WaitFor(t, 15*time.Second, "the Lease policy to take effect", func() bool {
		_, err := asA.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lease},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(idB)}}, metav1.CreateOptions{})
		return apierrors.IsForbidden(err)
	})

	// refused asserts err is a 403 whose message has want.
	refused := func(t *testing.T, what string, err error, want string) {
		t.Helper()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want Forbidden: %s", what, err, want)
		}
	}
	// asAdmin writes the Lease as the test's admin, to set up a state.
	asAdmin := func(t *testing.T, change func(*coordinationv1.Lease)) *coordinationv1.Lease {
		t.Helper()
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(l)
		if l, err = admin.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return l
	}
	// update writes the Lease as pod A after change: what a sidecar's token
	// could send.
	update := func(change func(*coordinationv1.Lease)) error {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(l)
		_, err = asA.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
		return err
	}

	t.Run("records Events about its own pod through client-go's recorder", func(t *testing.T) {
		b := record.NewBroadcaster()
		defer b.Shutdown()
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: asA.CoreV1().Events(ns)})
		r := b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "handoff"})
		// The same Event twice: a create, then a patch of its count.
		r.Event(&refA, corev1.EventTypeNormal, "HandoverComplete", "test")
		r.Event(&refA, corev1.EventTypeNormal, "HandoverComplete", "test")
		kubetest.WaitFor(t, 10*time.Second, "the Event written with count 2", func() bool {
			list, err := admin.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=HandoverComplete"})
			return err == nil && len(list.Items) == 1 && list.Items[0].Count == 2
		})
	})

	t.Run("is refused an Event about another pod", func(t *testing.T) {
		_, err := asA.CoreV1().Events(ns).Create(ctx, eventAbout(refB), metav1.CreateOptions{})
		refused(t, "an Event about pod B", err, "may record Events only about its own pod (uid "+string(podA.UID)+"), not about Pod "+ns+"/orders-b")
		// Its own name, another pod's UID (a replaced StatefulSet pod's).
		stale := refA
		stale.UID = podB.UID
		_, err = asA.CoreV1().Events(ns).Create(ctx, eventAbout(stale), metav1.CreateOptions{})
		refused(t, "an Event about its name with another UID", err, "may record Events only about its own pod")
		_, err = asA.CoreV1().Events(ns).Create(ctx, eventAbout(corev1.ObjectReference{Kind: "Lease", APIVersion: "coordination.k8s.io/v1", Namespace: ns, Name: lease}), metav1.CreateOptions{})
		refused(t, "an Event about a Lease", err, "not about Lease "+ns+"/"+lease)
		// Nor may it turn an Event it wrote into one about another pod.
		own, err := asA.CoreV1().Events(ns).Create(ctx, eventAbout(refA), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		own.InvolvedObject = refB
		_, err = asA.CoreV1().Events(ns).Update(ctx, own, metav1.UpdateOptions{})
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("an Event of its own changed to be about pod B: %v; want Forbidden", err)
		}
	})

	t.Run("writes its phase on its own pod, and nothing else of any pod's status", func(t *testing.T) {
		cond := func(phase, status string) []byte {
			return []byte(`{"status":{"conditions":[{"type":"` + protocol.PodConditionCoordinating + `","status":"` + status + `","reason":"` + phase + `","message":"test"}]}}`)
		}
		patch := func(c kubernetes.Interface, pod string, body []byte) error {
			_, err := c.CoreV1().Pods(ns).Patch(ctx, pod, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status")
			return err
		}
		kubetest.WaitFor(t, 15*time.Second, "the pod status policy to take effect", func() bool {
			return apierrors.IsForbidden(patch(asA, podB.Name, cond("Running", "True")))
		})
		for _, phase := range []string{"Running", "ShuttingDown", "Done"} {
			status := map[bool]string{true: "True", false: "False"}[phase == "Running"]
			if err := patch(asA, podA.Name, cond(phase, status)); err != nil {
				t.Fatalf("pod A writing its phase %s: %v", phase, err)
			}
		}
		if phase := coordinatingOf(t, admin, ns, podA.Name); phase != "Done/False" {
			t.Errorf("pod A's condition %s: %q, want Done/False", protocol.PodConditionCoordinating, phase)
		}
		refused(t, "pod B's condition", patch(asA, podB.Name, cond("Done", "False")), "may write the status of its own pod alone, not of pod orders-b")
		refused(t, "its own Ready condition", patch(asA, podA.Name, []byte(`{"status":{"conditions":[{"type":"Ready","status":"True"}]}}`)),
			"may change only the conditions "+protocol.PodConditionCoordinating+" and "+protocol.PodConditionShards+" of pod orders-a, not its other conditions")
		refused(t, "its own phase", patch(asA, podA.Name, []byte(`{"status":{"phase":"Succeeded"}}`)), "not the rest of its status")
		refused(t, "its own pod IP", patch(asA, podA.Name, []byte(`{"status":{"podIP":"10.0.0.9","podIPs":[{"ip":"10.0.0.9"}]}}`)), "not the rest of its status")
		refused(t, "a token bound to no pod", patch(unbound, podA.Name, cond("Running", "True")), "writes only with the token of one of its pods")
		// A status write carries the pod's metadata too: labels (a
		// Service's or a controller's selector), annotations, finalizers.
		const metadata = "may not change the labels, annotations, finalizers, owners or generateName of pod orders-a (of its annotations, only controller.kubernetes.io/pod-deletion-cost)"
		refused(t, "its labels, by a strategic merge patch", patch(asA, podA.Name, []byte(`{"metadata":{"labels":{"app":"payments"}}}`)), metadata)
		_, err := asA.CoreV1().Pods(ns).Patch(ctx, podA.Name, types.JSONPatchType, []byte(`[{"op":"add","path":"/metadata/labels","value":{"evil":"1"}}]`), metav1.PatchOptions{}, "status")
		refused(t, "its labels, by a JSON patch", err, metadata)
		_, err = asA.CoreV1().Pods(ns).Patch(ctx, podA.Name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"cluster-autoscaler.kubernetes.io/safe-to-evict":"false"}}}`), metav1.PatchOptions{}, "status")
		refused(t, "another annotation", err, metadata)
		_, err = asA.CoreV1().Pods(ns).Patch(ctx, podA.Name, types.MergePatchType, []byte(`{"metadata":{"generateName":"evil-"}}`), metav1.PatchOptions{}, "status")
		refused(t, "its generateName", err, metadata)
		two := []byte(`{"status":{"conditions":[{"type":"` + protocol.PodConditionCoordinating + `","status":"True","reason":"Running","message":"a"},` +
			`{"type":"` + protocol.PodConditionCoordinating + `","status":"False","reason":"Done","message":"b"}]}}`)
		_, err = asA.CoreV1().Pods(ns).Patch(ctx, podA.Name, types.MergePatchType, two, metav1.PatchOptions{}, "status")
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("two conditions %s: %v; want refused", protocol.PodConditionCoordinating, err)
		}
		_, err = asA.CoreV1().Pods(ns).Patch(ctx, podA.Name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":"0","`+protocol.DeletionCostOptIn+`":"true"}}}`), metav1.PatchOptions{}, "status")
		refused(t, "opting its pod in to the deletion cost", err, metadata)
		_, err = asA.CoreV1().Pods(ns).Patch(ctx, podA.Name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":"10"}}}`), metav1.PatchOptions{}, "status")
		refused(t, "its pod-deletion-cost annotation, its pod not opted in", err, "may set the annotation controller.kubernetes.io/pod-deletion-cost only on a pod annotated handoff.dev/deletion-cost: \"true\"")
		_, err = asA.CoreV1().Pods(ns).Patch(ctx, podA.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":["example.com/never"]}}`), metav1.PatchOptions{}, "status")
		refused(t, "a finalizer", err, metadata)
		_, err = asA.CoreV1().Pods(ns).Patch(ctx, podA.Name, types.ApplyPatchType, []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"orders-a","labels":{"app":"payments"}}}`),
			metav1.PatchOptions{FieldManager: "evil", Force: ptr.To(true)}, "status")
		refused(t, "its labels, by server-side apply", err, metadata)
		// The rest of the status.
		const rest = "not the rest of its status"
		refused(t, "its start time", patch(asA, podA.Name, []byte(`{"status":{"startTime":"2001-01-01T00:00:00Z"}}`)), rest)
		refused(t, "its reason", patch(asA, podA.Name, []byte(`{"status":{"reason":"NodeLost","message":"gone"}}`)), rest)
		refused(t, "its resize status", patch(asA, podA.Name, []byte(`{"status":{"resize":"Infeasible"}}`)), rest)
		// The condition itself.
		const own = "may write the condition " + protocol.PodConditionCoordinating + " only with reason Running (status True)"
		refused(t, "an unknown phase", patch(asA, podA.Name, cond("Hacked", "False")), own)
		refused(t, "Done with status True", patch(asA, podA.Name, cond("Done", "True")), own)
		big := []byte(`{"status":{"conditions":[{"type":"` + protocol.PodConditionCoordinating + `","status":"False","reason":"Done","message":"` + strings.Repeat("x", 1025) + `"}]}}`)
		refused(t, "a message of 1025 bytes", patch(asA, podA.Name, big), own)
		if got := coordinatingOf(t, admin, ns, podA.Name); got != "Done/False" {
			t.Errorf("after the refused writes, pod A's condition is %q, want Done/False as written last", got)
		}

		// The shards it holds (with a shard set), as shard.EncodeHeld
		// writes them: its own pod's alone, of that form.
		held := func(status, reason, message string) []byte {
			return []byte(`{"status":{"conditions":[{"type":"` + protocol.PodConditionShards + `","status":"` + status + `","reason":"` + reason + `","message":"` + message + `"}]}}`)
		}
		set := shard.SetID([]string{"orders-0", "orders-1"})
		for _, msg := range []string{
			shard.EncodeHeld([]string{"orders-0", "orders-1"}, []string{"orders-1"}),
			"shards none of 2 (set " + set + ")",
			"shards 0-3,7,9-999 of 1000 (set 0123abcd)",
		} {
			if err := patch(asA, podA.Name, held("True", protocol.ReasonShardsHeld, msg)); err != nil {
				t.Errorf("pod A writing the shards it holds, %q: %v", msg, err)
			}
		}
		const shards = "may write one condition " + protocol.PodConditionShards + " on pod orders-a, status True, reason Held"
		refused(t, "pod B's shards", patch(asA, podB.Name, held("True", "Held", "shards none of 2 (set "+set+")")), "may write the status of its own pod alone")
		for what, body := range map[string][]byte{
			"shards with status False":         held("False", "Held", "shards none of 2 (set "+set+")"),
			"shards with another reason":       held("True", "Taken", "shards none of 2 (set "+set+")"),
			"shards with a free message":       held("True", "Held", "anything at all"),
			"shards with an index of 4 digits": held("True", "Held", "shards 1000 of 1001 (set "+set+")"),
			"shards with a leading zero":       held("True", "Held", "shards 01 of 2 (set "+set+")"),
			"shards with a message over 2048":  held("True", "Held", "shards "+strings.Repeat("1,", 1100)+"1 of 2 (set "+set+")"),
		} {
			refused(t, what, patch(asA, podA.Name, body), shards)
		}
		_, err = asA.CoreV1().Pods(ns).Patch(ctx, podA.Name, types.MergePatchType, []byte(`{"status":{"conditions":[`+
			`{"type":"`+protocol.PodConditionShards+`","status":"True","reason":"Held","message":"shards none of 2 (set `+set+`)"},`+
			`{"type":"`+protocol.PodConditionShards+`","status":"True","reason":"Held","message":"shards 0 of 2 (set `+set+`)"}]}}`), metav1.PatchOptions{}, "status")
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("two conditions %s: %v; want refused", protocol.PodConditionShards, err)
		}
	})

	t.Run("keeps the pod-deletion-cost of its own pod, opted in, and no other annotation", func(t *testing.T) {
		// pod B opts in; its own token may then set the cost, as the
		// sidecar's write does (a merge patch of pods/status with its UID).
		p, err := admin.CoreV1().Pods(ns).Get(ctx, podB.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Annotations = map[string]string{protocol.DeletionCostOptIn: "true", "team": "orders"}
		if _, err := admin.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		cost := func(as kubernetes.Interface, annotations string) error {
			_, err := as.CoreV1().Pods(ns).Patch(ctx, podB.Name, types.MergePatchType,
				[]byte(`{"metadata":{"uid":"`+string(podB.UID)+`","annotations":{`+annotations+`}}}`), metav1.PatchOptions{}, "status")
			return err
		}
		for _, v := range []string{"10010", "0", "999999"} {
			if err := cost(asB, `"controller.kubernetes.io/pod-deletion-cost":"`+v+`"`); err != nil {
				t.Fatalf("pod B setting its own deletion cost to %s: %v", v, err)
			}
		}
		const form = "only to a whole number from 0 to 999999"
		refused(t, "a cost of 1000000", cost(asB, `"controller.kubernetes.io/pod-deletion-cost":"1000000"`), form)
		refused(t, "a negative cost", cost(asB, `"controller.kubernetes.io/pod-deletion-cost":"-5"`), form)
		// Not an int32 at all: the API server's own validation refuses it.
		for _, v := range []string{"1e3", "010", "x"} {
			if err := cost(asB, `"controller.kubernetes.io/pod-deletion-cost":"`+v+`"`); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
				t.Errorf("a cost of %q: %v; want refused", v, err)
			}
		}
		refused(t, "the cost removed", cost(asB, `"controller.kubernetes.io/pod-deletion-cost":null`), "(it may not remove it)")
		refused(t, "the cost with another annotation", cost(asB, `"controller.kubernetes.io/pod-deletion-cost":"5","team":"payments"`),
			"(of its annotations, only controller.kubernetes.io/pod-deletion-cost)")
		refused(t, "opting out", cost(asB, `"`+protocol.DeletionCostOptIn+`":"false"`), "(of its annotations, only controller.kubernetes.io/pod-deletion-cost)")
		refused(t, "pod A setting pod B's cost", cost(asA, `"controller.kubernetes.io/pod-deletion-cost":"0"`), "may write the status of its own pod alone, not of pod orders-b")
		p, err = admin.CoreV1().Pods(ns).Get(ctx, podB.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Annotations[corev1.PodDeletionCost]; got != "999999" || p.Annotations["team"] != "orders" || p.Annotations[protocol.DeletionCostOptIn] != "true" {
			t.Errorf("after the refused writes, pod B's annotations are %v, want the cost 999999 as written last and the rest unchanged", p.Annotations)
		}
	})

	t.Run("is refused every write with a token bound to no pod", func(t *testing.T) {
		_, err := unbound.CoreV1().Events(ns).Create(ctx, eventAbout(refA), metav1.CreateOptions{})
		refused(t, "an Event", err, "writes only with the token of one of its pods")
		_, err = unbound.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lease}}, metav1.CreateOptions{})
		refused(t, "a Lease create", err, "writes only with the token of one of its pods")
	})

	t.Run("holds, renews, releases and hands over its Lease as the sidecar does", func(t *testing.T) {
		leasesA := &forbiddenLog{LeasesGetter: asA.CoordinationV1()}
		leasesB := &forbiddenLog{LeasesGetter: asB.CoordinationV1()}
		holder := runElector(t, leasesA, ns, lease, idA)
		kubetest.WaitFor(t, 15*time.Second, "pod A to take and renew "+lease, func() bool {
			l, err := admin.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
			return err == nil && holder.terms() > 1 && ptr.Deref(l.Spec.HolderIdentity, "") == idA
		})
		standby := runElector(t, leasesB, ns, lease, idB)
		holder.stop()
		if !holder.e.Released() {
			t.Errorf("pod A did not release %s: %v", lease, holder.e.ReleaseErr())
		}
		kubetest.WaitFor(t, 15*time.Second, "pod B to take "+lease+" after the release", func() bool { return standby.terms() >= 1 })
		standby.stop()
		if !standby.e.Released() {
			t.Errorf("pod B did not release %s: %v", lease, standby.e.ReleaseErr())
		}
		for _, l := range []*forbiddenLog{leasesA, leasesB} {
			if errs := l.errors(); len(errs) > 0 {
				t.Errorf("an elector met %d Forbidden answers; the first: %v", len(errs), errs[0])
			}
		}
		// A release left over by a previous process of pod A (its release
		// withheld): freed by the sidecar's leftover release.
		asAdmin(t, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To(idA) })
		if freed, err := leaderelection.ReleaseLeftover(ctx, asA.CoordinationV1(), ns, lease, idA, 5*time.Second); err != nil || !freed {
			t.Errorf("the leftover release: freed %t, %v; want freed", freed, err)
		}
	})

	t.Run("is refused a Lease naming another pod as holder", func(t *testing.T) {
		asAdmin(t, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") })
		err := update(func(l *coordinationv1.Lease) {
			l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = ptr.To(idB), ptr.To[int32](15)
		})
		refused(t, "holder pod B", err, "may name as the holder of Lease "+lease+" only itself, "+idA+", or no one; not "+idB)
		// Pod A's name with another UID: a pod that is gone, of the same name.
		err = update(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To(podA.Name + "_" + string(podB.UID)) })
		refused(t, "holder pod A's name with another UID", err, "may name as the holder of Lease "+lease+" only itself")
	})

	t.Run("is refused a Lease duration of a day", func(t *testing.T) {
		err := update(func(l *coordinationv1.Lease) {
			l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = ptr.To(idA), ptr.To[int32](86400)
		})
		refused(t, "a day's lease duration", err, "may ask for a lease duration of at most 3600 s (1h, the handoff sidecar's longest) on Lease "+lease+", not 86400 s")
		if err := update(func(l *coordinationv1.Lease) {
			l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = ptr.To(idA), ptr.To[int32](3600)
		}); err != nil {
			t.Errorf("an hour's lease duration, the sidecar's longest: %v", err)
		}
	})

	t.Run("is refused freeing another pod's Lease", func(t *testing.T) {
		asAdmin(t, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To(idB) })
		err := update(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") })
		refused(t, "freeing pod B's Lease", err, "may free only a Lease it holds itself; Lease "+lease+" is held by "+idB)
	})

	t.Run("is refused moving the fencing token", func(t *testing.T) {
		l := asAdmin(t, func(l *coordinationv1.Lease) {
			l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To(""), ptr.To[int32](7)
		})
		for _, n := range []int32{6, 9, 1 << 30} {
			err := update(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To(idA), ptr.To(n) })
			refused(t, fmt.Sprintf("transitions 7 to %d", n), err, fmt.Sprintf("may move the transition count of Lease %s (its fencing token) only as an election does: from 7 to itself or one more, not to %d", lease, n))
		}
		// A new Lease starts at 0, as client-go creates it.
		if err := admin.CoordinationV1().Leases(ns).Delete(ctx, lease, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: ptr.To(l.ResourceVersion)}}); err != nil {
			t.Fatal(err)
		}
		_, err := asA.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lease},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(idA), LeaseTransitions: ptr.To[int32](1 << 30)}}, metav1.CreateOptions{})
		refused(t, "a create with transitions 2^30", err, "only as an election does: 0 on create, not to 1073741824")
		if _, err := asA.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lease},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(idA), LeaseDurationSeconds: ptr.To[int32](15), LeaseTransitions: ptr.To[int32](0)}}, metav1.CreateOptions{}); err != nil {
			t.Errorf("a create as client-go's election writes it: %v", err)
		}
	})

	t.Run("is refused giving the Lease an owner", func(t *testing.T) {
		err := update(func(l *coordinationv1.Lease) {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: podB.Name, UID: podB.UID}}
		})
		refused(t, "an owner reference", err, "may not change the owner references of Lease "+lease)
	})

	t.Run("gets and watches its own pod, and lists pods only with shards", func(t *testing.T) {
		if _, err := asA.CoreV1().Pods(ns).Get(ctx, podA.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("get its pod: %v", err)
		}
		// The sidecar's own watch of its pod (a client-go informer with
		// the field selector metadata.name): it syncs without list.
		w := prestop.NewPodWatch(asA.CoreV1(), ns, podA.Name)
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		go w.Run(wctx)
		kubetest.WaitFor(t, 10*time.Second, "the sidecar's watch of its pod to sync", w.Synced)
		if p, from, err := w.Pod(ctx, time.Second); err != nil || from != prestop.FromWatch || p.UID != podA.UID {
			t.Errorf("its pod from the watch: %v from %s, %v", p, from, err)
		}
		byName := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", podA.Name).String()}
		_, err := asA.CoreV1().Pods(ns).List(ctx, byName)
		refused(t, "list its own pod by name without shards", err, `cannot list resource "pods"`)
		_, err = asA.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		refused(t, "list the pods of its namespace without shards", err, `cannot list resource "pods"`)
		// A workload with shards lists its peers by label.
		peer := env.Pod(t, ns, "batch-0", 30)
		asPeer := kubernetes.NewForConfigOrDie(impersonate(env.Config, ns, sharded, peer.Name, string(peer.UID)))
		if _, err := asPeer.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=batch"}); err != nil {
			t.Errorf("list the shard's peers: %v", err)
		}
	})
}

// coordinatingOf is pod name's condition protocol.PodConditionCoordinating
// as reason/status, or "" without one.
func coordinatingOf(t *testing.T, c kubernetes.Interface, ns, name string) string {
	t.Helper()
	p, err := c.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == protocol.PodConditionCoordinating {
			return cond.Reason + "/" + string(cond.Status)
		}
	}
	return ""
}

// The status policy compares every field of PodStatus but its conditions:
// a field k8s.io/api adds must be added to it (or a status write could
// change it).
func TestPodStatusPolicyNamesEveryField(t *testing.T) {
	raw, err := os.ReadFile("../charts/handoff/templates/sidecar-pod-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	policy := string(raw)
	st := reflect.TypeFor[corev1.PodStatus]()
	for i := range st.NumField() {
		name, _, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
		if name == "conditions" {
			continue
		}
		if want := "object.status.?" + name + " == oldObject.status.?" + name; !strings.Contains(policy, want) {
			t.Errorf("the pod status policy does not compare status.%s: no %q", name, want)
		}
	}
}
