package check

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/handoff-dev/handoff/internal/cli/kube"
)

// The chart's require-injection ValidatingAdmissionPolicy
// (charts/handoff/templates/require-injection-policy.yaml, on with
// webhook.requireInjection) refuses the CREATE of a pod that asks for
// injection but comes without the sidecar, as when the webhook is down and
// its failurePolicy is Ignore. Its controller records FailedCreate and
// retries: the rollout waits. Two checks read it: pods-not-refused (the
// rollouts that wait now) and require-injection-policy (the policy and its
// binding are there at all).

// requireInjectionSuffix makes the name of the chart's require-injection
// policy, and of its binding, from the release's full name, which is also
// the name of its MutatingWebhookConfiguration: <fullname>-require-injection.
const requireInjectionSuffix = "-require-injection"

// vapDenied is how the API server's ValidatingAdmissionPolicy plugin
// begins the message of a request a policy denied (k8s.io/apiserver
// pkg/admission/plugin/policy/validating, dispatcher.go):
//
//	ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>
//
// The controllers put that error in their FailedCreate Event: the
// ReplicaSet controller's reads "Error creating: pods "<pod>" is forbidden:
// ValidatingAdmissionPolicy '…".
const vapDenied = "ValidatingAdmissionPolicy '"

// refusedWindow is how far back pods-not-refused reads FailedCreate
// Events: 30 minutes. A controller retries a refused create with its
// backoff, which client-go's default controller rate limiter caps at 1000 s
// (under 17 minutes); a workload that still waits has been refused again
// within the window, and an Event older than it says nothing of now.
const refusedWindow = 30 * time.Minute

// refusedWindowText is refusedWindow as the check's description says it.
const refusedWindowText = "30 minutes"

// eventPages bounds the list of FailedCreate Events: at most this many
// pages of kube.ListPage Events (2,000), so that a namespace full of
// Events is not paged forever; a check that stopped there says so.
const eventPages = 4

// refusedMax bounds how many workloads pods-not-refused reads (one GET
// each) and names.
const refusedMax = 20

// refusal is one workload, the involvedObject of FailedCreate Events, whose
// pods a require-injection policy refused within refusedWindow.
type refusal struct {
	Namespace, Kind, Name string
	UID                   types.UID
	// Policy is the refusing policy's name.
	Policy string
	// Attempts is how many creates were refused (the Events' counts);
	// First and Last, the first and the last of them.
	Attempts    int32
	First, Last time.Time
	// Filled from the workload (live): its controller ("Deployment orders"
	// or ""), and how many pods it wants and does not have (-1: not known).
	Owner   string
	Waiting int32
}

// refusingPolicy returns the name of the require-injection policy that a
// FailedCreate Event's message says denied the create, or "" if none did.
func refusingPolicy(message string) string {
	_, rest, ok := strings.Cut(message, vapDenied)
	if !ok {
		return ""
	}
	name, _, ok := strings.Cut(rest, "'")
	if !ok || !strings.HasSuffix(name, requireInjectionSuffix) {
		return ""
	}
	return name
}

// eventTimes returns when an Event (core/v1, as the controllers' legacy
// recorder writes them, or one written through events.k8s.io/v1) was first
// and last seen, and how many times.
func eventTimes(ev *corev1.Event) (first, last time.Time, count int32) {
	first, last, count = ev.FirstTimestamp.Time, ev.LastTimestamp.Time, ev.Count
	if ev.Series != nil {
		last, count = firstSet(ev.Series.LastObservedTime.Time, last), ev.Series.Count
	}
	first = firstSet(first, ev.EventTime.Time, ev.CreationTimestamp.Time)
	last = firstSet(last, ev.EventTime.Time, first)
	return first, last, max(count, 1)
}

// firstSet returns the first of ts that is not zero, or the zero time.
func firstSet(ts ...time.Time) time.Time {
	for _, t := range ts {
		if !t.IsZero() {
			return t
		}
	}
	return time.Time{}
}

// refusals groups the FailedCreate Events whose message names a
// require-injection policy and that were last seen within refusedWindow of
// now, by their involvedObject, in order of namespace, kind and name.
// Waiting is -1 (not known) in each.
func refusals(events []corev1.Event, now time.Time) []refusal {
	byObject := map[types.UID]*refusal{}
	var out []*refusal
	for i := range events {
		ev := &events[i]
		if ev.Reason != "FailedCreate" {
			continue
		}
		policy := refusingPolicy(ev.Message)
		if policy == "" {
			continue
		}
		first, last, count := eventTimes(ev)
		if now.Sub(last) > refusedWindow {
			continue
		}
		o := ev.InvolvedObject
		key := cmp.Or(o.UID, types.UID(o.Namespace+"/"+o.Kind+"/"+o.Name))
		r := byObject[key]
		if r == nil {
			r = &refusal{Namespace: cmp.Or(o.Namespace, ev.Namespace), Kind: o.Kind, Name: o.Name, UID: o.UID, Policy: policy, First: first, Last: last, Waiting: -1}
			byObject[key] = r
			out = append(out, r)
		}
		r.Attempts += count
		if first.Before(r.First) {
			r.First = first
		}
		if last.After(r.Last) {
			r.Last, r.Policy = last, policy
		}
	}
	slices.SortFunc(out, func(a, b *refusal) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Kind, b.Kind), strings.Compare(a.Name, b.Name))
	})
	res := make([]refusal, len(out))
	for i, r := range out {
		res[i] = *r
	}
	return res
}

// describeRefusals is pods-not-refused's failure: each workload that
// waits, its controller, how many pods it waits for, since when, and the
// remedy. truncated says the Events were not all read.
func describeRefusals(rs []refusal, now time.Time, truncated string) error {
	var b strings.Builder
	policies := map[string]bool{}
	for _, r := range rs {
		policies[r.Policy] = true
	}
	workloads := "1 workload waits"
	if len(rs) != 1 {
		workloads = fmt.Sprintf("%d workloads wait", len(rs))
	}
	fmt.Fprintf(&b, "%s for pods the require-injection policy (%s) refuses, because the webhook did not inject them:",
		workloads, strings.Join(slices.Sorted(maps.Keys(policies)), ", "))
	for i, r := range rs {
		if i == refusedMax {
			fmt.Fprintf(&b, "\n- and %d more (not read)", len(rs)-refusedMax)
			break
		}
		fmt.Fprintf(&b, "\n- %s %s/%s", r.Kind, r.Namespace, r.Name)
		if r.Owner != "" {
			fmt.Fprintf(&b, " (%s)", r.Owner)
		}
		switch {
		case r.Waiting == 1:
			b.WriteString(": 1 pod waiting")
		case r.Waiting > 1:
			fmt.Fprintf(&b, ": %d pods waiting", r.Waiting)
		default:
			b.WriteString(": pods waiting")
		}
		times := "times"
		if r.Attempts == 1 {
			times = "time"
		}
		fmt.Fprintf(&b, ", refused %d %s since %s (%s ago), last %s ago",
			r.Attempts, times, r.First.UTC().Format(time.RFC3339), now.Sub(r.First).Round(time.Second), now.Sub(r.Last).Round(time.Second))
	}
	b.WriteString("\nIs the webhook's Deployment scaled down, or are its pods not ready (see webhook-endpoints and webhook-injects)? " +
		"Once the webhook is back, the controllers' retries create the pods, injected: nothing else to do; " +
		"until then, nothing of these rollouts starts without the sidecar.")
	if truncated != "" {
		b.WriteString("\n" + truncated)
	}
	return errors.New(b.String())
}

// listFailedCreates lists the FailedCreate Events of e.namespace (every
// namespace with -A), at most eventPages pages; truncated says where it
// stopped, if it did.
func listFailedCreates(ctx context.Context, e *checkEnv) (events []corev1.Event, truncated string, err error) {
	opts := metav1.ListOptions{FieldSelector: "reason=FailedCreate", Limit: kube.ListPage}
	for page := 0; ; page++ {
		if page == eventPages {
			where := "namespace " + e.namespace
			if e.namespace == "" {
				where = "all namespaces"
			}
			return events, fmt.Sprintf("(read the first %d FailedCreate Events of %s only)", len(events), where), nil
		}
		list, err := e.client.CoreV1().Events(e.namespace).List(ctx, opts)
		if err != nil {
			return nil, "", err
		}
		events = append(events, list.Items...)
		if opts.Continue = list.Continue; opts.Continue == "" {
			return events, "", nil
		}
	}
}

// checkPodsNotRefused finds the workloads whose pods the require-injection
// policy refused within refusedWindow (their FailedCreate Events) and that
// still want pods: their rollouts wait for the webhook.
func checkPodsNotRefused(ctx context.Context, e *checkEnv) (string, error) {
	events, truncated, err := listFailedCreates(ctx, e)
	if err != nil {
		return "", err
	}
	var waiting []refusal
	for i, r := range refusals(events, e.now) {
		if i == refusedMax {
			// Not read: named by describeRefusals as more.
			waiting = append(waiting, r)
			continue
		}
		if err := workloadWaits(ctx, e, &r); err != nil {
			return "", err
		}
		if r.Waiting != 0 {
			waiting = append(waiting, r)
		}
	}
	if len(waiting) > 0 {
		return "", describeRefusals(waiting, e.now, truncated)
	}
	return strings.TrimSpace(fmt.Sprintf("no refusal in the last %s %s", refusedWindowText, truncated)), nil
}

// workloadWaits fills r's Owner and Waiting from its workload: the pods its
// spec wants and its status does not count. A workload that is gone, or
// no longer the one refused, waits for nothing (0); one that cannot be
// read, or of another kind, is not known (-1).
func workloadWaits(ctx context.Context, e *checkEnv, r *refusal) error {
	var (
		meta          metav1.ObjectMeta
		want, have    int32
		err           error
		known, exists = true, true
	)
	switch r.Kind {
	case "ReplicaSet":
		got, gerr := e.client.AppsV1().ReplicaSets(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
		if err = gerr; err == nil {
			meta, want, have = got.ObjectMeta, ptrOr(got.Spec.Replicas, 1), got.Status.Replicas
		}
	case "StatefulSet":
		got, gerr := e.client.AppsV1().StatefulSets(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
		if err = gerr; err == nil {
			meta, want, have = got.ObjectMeta, ptrOr(got.Spec.Replicas, 1), got.Status.Replicas
		}
	case "DaemonSet":
		got, gerr := e.client.AppsV1().DaemonSets(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
		if err = gerr; err == nil {
			meta, want, have = got.ObjectMeta, got.Status.DesiredNumberScheduled, got.Status.CurrentNumberScheduled
		}
	default:
		known = false
	}
	switch {
	case apierrors.IsNotFound(err):
		exists = false
	case apierrors.IsForbidden(err):
		known = false
	case err != nil:
		return err
	}
	r.Waiting = -1
	if !exists || (r.UID != "" && known && meta.UID != r.UID) {
		r.Waiting = 0
		return nil
	}
	if !known {
		return nil
	}
	if c := metav1.GetControllerOf(&meta); c != nil {
		r.Owner = c.Kind + " " + c.Name
	}
	r.Waiting = max(want-have, 0)
	return nil
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// requireInjectionGap says what is missing of the require-injection
// policy of the webhook configuration cfg, given the policy and binding of
// its name found (nil: not found); nil when nothing is, or when none of
// cfg's webhooks has failurePolicy Ignore (with Fail the API server refuses
// a pod it could not send to the webhook itself).
func requireInjectionGap(cfg admissionregistrationv1.MutatingWebhookConfiguration, policy *admissionregistrationv1.ValidatingAdmissionPolicy, binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding) error {
	if !slices.ContainsFunc(cfg.Webhooks, func(h admissionregistrationv1.MutatingWebhook) bool {
		return h.FailurePolicy != nil && *h.FailurePolicy == admissionregistrationv1.Ignore
	}) {
		return nil
	}
	name := cfg.Name + requireInjectionSuffix
	var missing string
	switch {
	case policy == nil:
		missing = "no ValidatingAdmissionPolicy " + name
	case binding == nil:
		missing = "no ValidatingAdmissionPolicyBinding " + name
	case binding.Spec.PolicyName != name:
		missing = fmt.Sprintf("the ValidatingAdmissionPolicyBinding %s binds %q, not the policy %s", name, binding.Spec.PolicyName, name)
	case !slices.Contains(binding.Spec.ValidationActions, admissionregistrationv1.Deny):
		missing = fmt.Sprintf("the ValidatingAdmissionPolicyBinding %s does not Deny (validationActions %v)", name, binding.Spec.ValidationActions)
	default:
		return nil
	}
	return fmt.Errorf("%s: pods that ask for injection would be admitted without the sidecar while the webhook is down "+
		"(its failurePolicy is Ignore); install the chart with webhook.requireInjection=true, its default, or set webhook.failurePolicy=Fail", missing)
}

// checkRequireInjectionPolicy: for each handoff webhook configuration
// whose webhooks fail open, its require-injection policy and binding exist.
func checkRequireInjectionPolicy(ctx context.Context, e *checkEnv) (string, error) {
	var (
		errs  []error
		found []string
	)
	for _, cfg := range e.configs {
		name := cfg.Name + requireInjectionSuffix
		policy, err := e.client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			policy, err = nil, nil
		}
		if err != nil {
			return "", err
		}
		binding, err := e.client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			binding, err = nil, nil
		}
		if err != nil {
			return "", err
		}
		if err := requireInjectionGap(cfg, policy, binding); err != nil {
			errs = append(errs, err)
		} else if policy != nil {
			found = append(found, name)
		}
	}
	if len(found) == 0 && len(errs) == 0 {
		return "the webhook fails closed (failurePolicy Fail)", nil
	}
	return strings.Join(found, ", "), errors.Join(errs...)
}
