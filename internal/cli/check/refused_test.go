package check

import (
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/charttest"
)

// refusedMessage is a ReplicaSet controller's FailedCreate message for a
// pod the chart's policy refused, as the API server words the denial
// (k8s.io/apiserver's validating policy dispatcher) and the chart the
// policy's message.
func refusedMessage(policy, pod string) string {
	return `Error creating: pods "` + pod + `" is forbidden: ValidatingAdmissionPolicy '` + policy + `' with binding '` + policy +
		`' denied request: handoff: the handoff webhook did not inject pod ` + pod + `, which asks for injection (handoff.dev/inject: "true"), so it would run without the sidecar ` +
		`(missing: annotation handoff.dev/status: injected, label handoff.dev/injected: "true", init container handoff-install, sidecar container handoff): is the webhook running? Run handoff check.`
}

func TestRefusingPolicy(t *testing.T) {
	for _, tc := range []struct {
		message, want string
	}{
		{refusedMessage("handoff-require-injection", "orders-7d9f-x2"), "handoff-require-injection"},
		{"(combined from similar events): " + refusedMessage("prod-handoff-require-injection", "orders-7d9f-x2"), "prod-handoff-require-injection"},
		// StatefulSet's wording.
		{`create Pod orders-0 in StatefulSet orders failed error: pods "orders-0" is forbidden: ValidatingAdmissionPolicy 'h-require-injection' with binding 'h-require-injection' denied request: …`, "h-require-injection"},
		// Another policy, another cause.
		{`Error creating: pods "x" is forbidden: ValidatingAdmissionPolicy 'no-privileged' with binding 'no-privileged' denied request: no`, ""},
		{`Error creating: pods "x" is forbidden: exceeded quota: compute-resources`, ""},
		{`Error creating: ValidatingAdmissionPolicy 'unterminated-require-injection`, ""},
	} {
		if got := refusingPolicy(tc.message); got != tc.want {
			t.Errorf("refusingPolicy(%q) = %q, want %q", tc.message, got, tc.want)
		}
	}
}

func TestRefusals(t *testing.T) {
	now := time.Date(2026, 12, 7, 5, 30, 0, 0, time.UTC)
	ago := func(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }
	ev := func(kind, name, uid, reason, message string, first, last time.Duration, count int32) corev1.Event {
		return corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "shop"}, Reason: reason, Message: message, Count: count,
			InvolvedObject: corev1.ObjectReference{Kind: kind, Namespace: "shop", Name: name, UID: k8stypes.UID("uid-" + uid)},
			FirstTimestamp: ago(first), LastTimestamp: ago(last)}
	}
	policy := "handoff-require-injection"
	events := []corev1.Event{
		// Ten distinct messages (one pod name each), then the recorder's
		// aggregate, whose count grows: one workload, their sum.
		ev("ReplicaSet", "orders-7d9f", "a", "FailedCreate", refusedMessage(policy, "orders-7d9f-aaaa"), 12*time.Minute, 12*time.Minute, 1),
		ev("ReplicaSet", "orders-7d9f", "a", "FailedCreate", refusedMessage(policy, "orders-7d9f-bbbb"), 11*time.Minute, 11*time.Minute, 1),
		ev("ReplicaSet", "orders-7d9f", "a", "FailedCreate", "(combined from similar events): "+refusedMessage(policy, "orders-7d9f-cccc"), 10*time.Minute, time.Minute, 5),
		// Another workload, refused once, a while ago but within the window.
		ev("StatefulSet", "ledger", "b", "FailedCreate", refusedMessage(policy, "ledger-0"), 29*time.Minute, 29*time.Minute, 1),
		// Last seen before the window: says nothing of now.
		ev("ReplicaSet", "old-5c4", "c", "FailedCreate", refusedMessage(policy, "old-5c4-zzzz"), 2*time.Hour, 31*time.Minute, 40),
		// Another cause, another reason.
		ev("ReplicaSet", "quota-1", "d", "FailedCreate", `Error creating: pods "q" is forbidden: exceeded quota: compute`, time.Minute, time.Minute, 3),
		ev("ReplicaSet", "scaled-1", "e", "SuccessfulCreate", "Created pod: scaled-1-abcd", time.Minute, time.Minute, 1),
	}
	// An Event written through events.k8s.io/v1: eventTime and series.
	series := corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "shop"}, Reason: "FailedCreate", Message: refusedMessage("b-require-injection", "jobpod"),
		InvolvedObject: corev1.ObjectReference{Kind: "Job", Namespace: "shop", Name: "nightly", UID: "uid-f"},
		EventTime:      metav1.NewMicroTime(now.Add(-8 * time.Minute)), Series: &corev1.EventSeries{Count: 4, LastObservedTime: metav1.NewMicroTime(now.Add(-2 * time.Minute))}}
	events = append(events, series)

	got := refusals(events, now)
	want := []refusal{
		{Namespace: "shop", Kind: "Job", Name: "nightly", UID: "uid-f", Policy: "b-require-injection", Attempts: 4, First: now.Add(-8 * time.Minute), Last: now.Add(-2 * time.Minute), Waiting: -1},
		{Namespace: "shop", Kind: "ReplicaSet", Name: "orders-7d9f", UID: "uid-a", Policy: policy, Attempts: 7, First: now.Add(-12 * time.Minute), Last: now.Add(-time.Minute), Waiting: -1},
		{Namespace: "shop", Kind: "StatefulSet", Name: "ledger", UID: "uid-b", Policy: policy, Attempts: 1, First: now.Add(-29 * time.Minute), Last: now.Add(-29 * time.Minute), Waiting: -1},
	}
	if len(got) != len(want) {
		t.Fatalf("refusals: got %d workloads, want %d:\n%+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Namespace != w.Namespace || g.Kind != w.Kind || g.Name != w.Name || g.UID != w.UID || g.Policy != w.Policy ||
			g.Attempts != w.Attempts || !g.First.Equal(w.First) || !g.Last.Equal(w.Last) || g.Waiting != w.Waiting {
			t.Errorf("refusal %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
	if len(refusals(nil, now)) != 0 {
		t.Error("refusals of no Events: want none")
	}
}

func TestDescribeRefusals(t *testing.T) {
	now := time.Date(2026, 12, 7, 5, 30, 0, 0, time.UTC)
	rs := []refusal{
		{Namespace: "shop", Kind: "ReplicaSet", Name: "orders-7d9f", Policy: "handoff-require-injection", Owner: "Deployment orders",
			Attempts: 7, First: now.Add(-12 * time.Minute), Last: now.Add(-time.Minute), Waiting: 2},
		{Namespace: "shop", Kind: "StatefulSet", Name: "ledger", Policy: "handoff-require-injection",
			Attempts: 1, First: now.Add(-29 * time.Minute), Last: now.Add(-29 * time.Minute), Waiting: 1},
		{Namespace: "shop", Kind: "Job", Name: "nightly", Policy: "b-require-injection", Attempts: 4, First: now.Add(-8 * time.Minute), Last: now.Add(-2 * time.Minute), Waiting: -1},
	}
	msg := describeRefusals(rs, now, "(read the first 2000 FailedCreate Events of namespace shop only)").Error()
	for _, want := range []string{
		"3 workloads wait for pods the require-injection policy (b-require-injection, handoff-require-injection) refuses",
		"- ReplicaSet shop/orders-7d9f (Deployment orders): 2 pods waiting, refused 7 times since 2026-12-07T05:18:00Z (12m0s ago), last 1m0s ago",
		"- StatefulSet shop/ledger: 1 pod waiting, refused 1 time since 2026-12-07T05:01:00Z (29m0s ago)",
		"- Job shop/nightly: pods waiting, refused 4 times",
		"Is the webhook's Deployment scaled down, or are its pods not ready (see webhook-endpoints and webhook-injects)?",
		"read the first 2000 FailedCreate Events",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("describeRefusals does not say %q:\n%s", want, msg)
		}
	}
	if msg := describeRefusals(rs[:1], now, "").Error(); !strings.HasPrefix(msg, "1 workload waits for pods") || strings.Contains(msg, "read the first") {
		t.Errorf("describeRefusals of one workload, all Events read:\n%s", msg)
	}
	many := make([]refusal, refusedMax+3)
	for i := range many {
		many[i] = refusal{Kind: "ReplicaSet", Namespace: "shop", Name: "rs", Policy: "h-require-injection", Attempts: 1, First: now, Last: now, Waiting: 1}
	}
	if msg := describeRefusals(many, now, "").Error(); strings.Count(msg, "\n- ReplicaSet") != refusedMax || !strings.Contains(msg, "and 3 more") {
		t.Errorf("describeRefusals of %d: want %d named and 3 more:\n%s", len(many), refusedMax, msg)
	}
}

func TestRequireInjectionGap(t *testing.T) {
	hook := func(fp admissionregistrationv1.FailurePolicyType) admissionregistrationv1.MutatingWebhook {
		return admissionregistrationv1.MutatingWebhook{Name: "inject.handoff.dev", FailurePolicy: ptr.To(fp)}
	}
	cfg := func(hooks ...admissionregistrationv1.MutatingWebhook) admissionregistrationv1.MutatingWebhookConfiguration {
		return admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "handoff"}, Webhooks: hooks}
	}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "handoff-require-injection"}}
	binding := func(name string, actions ...admissionregistrationv1.ValidationAction) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
		return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "handoff-require-injection"},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name, ValidationActions: actions}}
	}
	ignore, fail := hook(admissionregistrationv1.Ignore), hook(admissionregistrationv1.Fail)
	for _, tc := range []struct {
		name    string
		cfg     admissionregistrationv1.MutatingWebhookConfiguration
		policy  *admissionregistrationv1.ValidatingAdmissionPolicy
		binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
		want    string // "" for none
	}{
		{"both, Deny", cfg(ignore), policy, binding("handoff-require-injection", admissionregistrationv1.Deny, admissionregistrationv1.Audit), ""},
		{"no policy", cfg(ignore), nil, nil, "no ValidatingAdmissionPolicy handoff-require-injection: pods that ask for injection would be admitted without the sidecar while the webhook is down"},
		{"no binding", cfg(fail, ignore), policy, nil, "no ValidatingAdmissionPolicyBinding handoff-require-injection: pods that ask for injection would be admitted without the sidecar while the webhook is down"},
		{"another policy bound", cfg(ignore), policy, binding("other", admissionregistrationv1.Deny), `binds "other", not the policy handoff-require-injection`},
		{"a binding that only warns", cfg(ignore), policy, binding("handoff-require-injection", admissionregistrationv1.Warn), "does not Deny (validationActions [Warn])"},
		// With failurePolicy Fail the API server refuses the pods itself.
		{"fails closed", cfg(fail), nil, nil, ""},
	} {
		err := requireInjectionGap(tc.cfg, tc.policy, tc.binding)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v; want none", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v; want %q", tc.name, err, tc.want)
		}
	}
}

// The chart names its require-injection policy and binding after its
// MutatingWebhookConfiguration plus requireInjectionSuffix, as the checks
// look them up; and its refusal carries the API server's form that
// refusingPolicy reads only through the policy's name.
func TestRequireInjectionPolicyNaming(t *testing.T) {
	if testing.Short() {
		t.Skip("renders the chart with helm")
	}
	objs := charttest.Render(t, "prod", "handoff", "--show-only", "templates/mutatingwebhookconfiguration.yaml", "--show-only", "templates/require-injection-policy.yaml")
	names := map[string]string{}
	for _, o := range objs {
		names[o.GetKind()] = o.GetName()
	}
	cfg := names["MutatingWebhookConfiguration"]
	if cfg == "" || names["ValidatingAdmissionPolicy"] != cfg+requireInjectionSuffix || names["ValidatingAdmissionPolicyBinding"] != cfg+requireInjectionSuffix {
		t.Errorf("the chart renders %v; want the policy and binding named <webhook configuration>%s", names, requireInjectionSuffix)
	}
}
