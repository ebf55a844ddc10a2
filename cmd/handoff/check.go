//go:build !sidecaronly

package main

import (
	"cmp"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/mod/semver"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	kversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
	certutil "k8s.io/client-go/util/cert"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/protocol"
)

const checkLong = `check runs checks of a handoff installation against the cluster of the
kubeconfig, as linkerd check does: grouped, each one passed (√), failed (×)
or a warning (‼), with a hint and a link to docs/checks.md for each one that
did not pass; it exits non-zero when a check failed (warnings do not).

Without --pre, the live checks: the API server and its version; the
webhook's MutatingWebhookConfiguration (label app.kubernetes.io/part-of=
handoff), its caBundle and its expiry, its Service's ready endpoints; a
server-side dry run of a pod labelled handoff.dev/inject=true in -n's
namespace, which must come back injected (with failurePolicy Ignore, a
webhook the API server cannot reach lets pods start without the sidecar,
and only this shows it); then, for the injected pods of -n's namespace (all
with -A): pods labelled for injection that run without the sidecar,
sidecars older than the webhook, each pod's service account allowed to
update its Leases and no other (SubjectAccessReview), and each pod's time
budgets (its sidecar's lease duration, renew deadline and retry period,
and its grace period against deadline-margin plus handback-reserve).

With --pre, before installing: the API server and its version, and whether
you may create what the chart installs.

The kubeconfig is read as kubectl reads it. -o json prints
{"success": bool, "categories": [{"name": ..., "checks": [{"id": ...,
"description": ..., "status": "ok|warning|failed|skipped", "detail": ...,
"hint": "<docs URL>"}]}]}.`

// checkHintBase is where each check's hint lives: docs/checks.md, one
// heading per check ID.
const checkHintBase = "https://github.com/handoff-dev/handoff/blob/main/docs/checks.md#"

// minKubernetes is the oldest supported Kubernetes (the README's, Chart.yaml's
// kubeVersion, the Makefile's KUBE_OLDEST).
const minKubernetes = "1.35.0"

// Check statuses, as checkResult.Status.
const (
	checkOK      = "ok"
	checkWarning = "warning"
	checkFailed  = "failed"
	checkSkipped = "skipped"
)

// healthCheck is one check, as data: the runner (runChecks) runs them in
// order and prints them for text and JSON alike.
type healthCheck struct {
	Category, ID, Description string
	// Warning: a failure is reported as a warning, and does not fail the run.
	Warning bool
	// Pre and Live say which mode runs the check.
	Pre, Live bool
	// Needs are the IDs of checks that must have passed (or warned) for this
	// one to run; else it is skipped.
	Needs []string
	// Run returns a detail for the output, and an error when the check
	// does not pass; errSkip (wrapped) skips it with the error's text.
	Run func(ctx context.Context, e *checkEnv) (detail string, err error)
}

// errSkip marks a check that does not apply.
var errSkip = errors.New("skipped")

// checkEnv is what the checks read, and what earlier checks found.
type checkEnv struct {
	client kubernetes.Interface
	// namespace is the workloads' namespace ("" for all with -A); the dry
	// run goes to dryRunNamespace.
	namespace, dryRunNamespace string
	now                        time.Time
	// Found by the checks that ran before.
	server  *utilversion.Version
	configs []admissionregistrationv1.MutatingWebhookConfiguration
	pods    []corev1.Pod // the injected pods, not finished
}

// checkResult is one check's result.
type checkResult struct {
	ID          string `json:"id"`
	Description string `json:"description"`
	Status      string `json:"status"`
	Detail      string `json:"detail,omitempty"`
	Hint        string `json:"hint,omitempty"`
}

// checkCategory is the results of one category, in order.
type checkCategory struct {
	Name   string        `json:"name"`
	Checks []checkResult `json:"checks"`
}

// checkReport is what check prints with -o json.
type checkReport struct {
	Success    bool            `json:"success"`
	Categories []checkCategory `json:"categories"`
}

// checkTimeout bounds each check.
const checkTimeout = 10 * time.Second

// runChecks runs the checks of a mode (pre or live) in order; each one
// within checkTimeout.
func runChecks(ctx context.Context, e *checkEnv, checks []healthCheck, pre bool) checkReport {
	r := checkReport{Success: true}
	passed := map[string]bool{}
	for _, c := range checks {
		if (pre && !c.Pre) || (!pre && !c.Live) {
			continue
		}
		res := checkResult{ID: c.ID, Description: c.Description}
		if i := slices.IndexFunc(c.Needs, func(id string) bool { return !passed[id] }); i >= 0 {
			res.Status, res.Detail = checkSkipped, "needs "+c.Needs[i]
		} else {
			cctx, cancel := context.WithTimeout(ctx, checkTimeout)
			detail, err := c.Run(cctx, e)
			cancel()
			res.Detail = detail
			switch {
			case errors.Is(err, errSkip):
				res.Status, res.Detail = checkSkipped, err.Error()
			case err != nil:
				res.Status, res.Detail, res.Hint = checkFailed, err.Error(), checkHintBase+c.ID
				if c.Warning {
					res.Status = checkWarning
					passed[c.ID] = true
				} else {
					r.Success = false
				}
			default:
				res.Status = checkOK
				passed[c.ID] = true
			}
		}
		if n := len(r.Categories); n == 0 || r.Categories[n-1].Name != c.Category {
			r.Categories = append(r.Categories, checkCategory{Name: c.Category})
		}
		cat := &r.Categories[len(r.Categories)-1]
		cat.Checks = append(cat.Checks, res)
	}
	return r
}

// writeChecks prints r as text (linkerd check's form) or JSON.
func writeChecks(w io.Writer, r checkReport, format string) error {
	if format == "json" {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	marks := map[string]string{checkOK: "√", checkWarning: "‼", checkFailed: "×", checkSkipped: "-"}
	for i, cat := range r.Categories {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s\n%s\n", cat.Name, strings.Repeat("-", len(cat.Name)))
		for _, c := range cat.Checks {
			line := marks[c.Status] + " " + c.Description
			if c.Status == checkOK && c.Detail != "" {
				line += " (" + c.Detail + ")"
			}
			fmt.Fprintln(w, line)
			if c.Status != checkOK && c.Detail != "" {
				for l := range strings.SplitSeq(c.Detail, "\n") {
					fmt.Fprintf(w, "    %s\n", l)
				}
			}
			if c.Hint != "" {
				fmt.Fprintf(w, "    see %s for hints\n", c.Hint)
			}
		}
	}
	result := "√"
	if !r.Success {
		result = "×"
	}
	_, err := fmt.Fprintf(w, "\nStatus check results are %s\n", result)
	return err
}

func checkCommand() *cobra.Command {
	var (
		pre, all bool
		format   string
		kube     kubeFlags
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check a handoff installation (or, with --pre, a cluster before installing)",
		Long:  checkLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var errs []error
			if format != "" && format != "json" {
				errs = append(errs, fmt.Errorf("--output %q: want json, or none for text", format))
			}
			if err := errors.Join(append(errs, kube.check())...); err != nil {
				return err
			}
			client, ns, err := kube.client(checkTimeout)
			if err != nil {
				return err
			}
			e := &checkEnv{client: client, namespace: ns, dryRunNamespace: ns, now: time.Now()}
			if all {
				e.namespace = ""
			}
			r := runChecks(cmd.Context(), e, healthChecks, pre)
			if err := writeChecks(cmd.OutOrStdout(), r, format); err != nil {
				return err
			}
			if !r.Success {
				cmd.SilenceUsage = true
				return errors.New("a check failed")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&pre, "pre", false, "check the cluster before installing handoff")
	f.StringVarP(&format, "output", "o", "", "json (the shape above); text without it")
	kube.add(f, "namespace of the workloads checked and of the dry-run pod; empty: the context's, else default")
	f.BoolVarP(&all, "all-namespaces", "A", false, "check the injected pods of every namespace (the dry run stays in -n's)")
	return cmd
}

// healthChecks are every check, in the order they run and print.
var healthChecks = []healthCheck{
	{Category: "kubernetes-api", ID: "api-reachable", Description: "can reach the API server", Pre: true, Live: true,
		Run: func(ctx context.Context, e *checkEnv) (string, error) {
			raw, err := e.client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
			if err != nil {
				return "", err
			}
			var info kversion.Info
			if err := json.Unmarshal(raw, &info); err != nil {
				return "", fmt.Errorf("/version: %w", err)
			}
			v, err := utilversion.ParseSemantic(info.GitVersion)
			if err != nil {
				return "", fmt.Errorf("version %q: %w", info.GitVersion, err)
			}
			e.server = v
			return info.GitVersion, nil
		}},
	{Category: "kubernetes-api", ID: "kubernetes-version", Description: "Kubernetes is " + strings.TrimSuffix(minKubernetes, ".0") + " or later (native sidecars, ValidatingAdmissionPolicy)",
		Pre: true, Live: true, Needs: []string{"api-reachable"},
		Run: func(_ context.Context, e *checkEnv) (string, error) {
			if e.server.LessThan(utilversion.MustParseSemantic(minKubernetes)) {
				return "", fmt.Errorf("the API server is %s", e.server)
			}
			return "", nil
		}},
	{Category: "pre-install", ID: "install-rights", Description: "you may create what the chart installs", Pre: true, Needs: []string{"api-reachable"},
		Run: checkInstallRights},
	{Category: "pre-install", ID: "no-webhook-yet", Description: "no handoff webhook is installed yet", Pre: true, Warning: true, Needs: []string{"api-reachable"},
		Run: func(ctx context.Context, e *checkEnv) (string, error) {
			if err := findWebhookConfigs(ctx, e); err != nil {
				return "", err
			}
			if len(e.configs) > 0 {
				return "", fmt.Errorf("found %s: an upgrade, not an install (docs/upgrading.md)", configNames(e.configs))
			}
			return "", nil
		}},
	{Category: "handoff-webhook", ID: "webhook-config", Description: "the webhook's MutatingWebhookConfiguration exists", Live: true, Needs: []string{"api-reachable"},
		Run: func(ctx context.Context, e *checkEnv) (string, error) {
			if err := findWebhookConfigs(ctx, e); err != nil {
				return "", err
			}
			if len(e.configs) == 0 {
				return "", errors.New("no MutatingWebhookConfiguration labelled " + handoffPartOf + ": install the chart")
			}
			return configNames(e.configs), nil
		}},
	{Category: "handoff-webhook", ID: "webhook-ca-bundle", Description: "its caBundle holds a CA certificate valid now", Live: true, Needs: []string{"webhook-config"},
		Run: func(_ context.Context, e *checkEnv) (string, error) {
			return "", eachWebhook(e, func(h admissionregistrationv1.MutatingWebhook) error {
				certs, err := caCerts(h)
				if err != nil {
					return err
				}
				for _, c := range certs {
					if e.now.Before(c.NotBefore) || e.now.After(c.NotAfter) {
						return fmt.Errorf("its CA %q is valid from %s to %s, not now", c.Subject.CommonName, c.NotBefore.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339))
					}
				}
				return nil
			})
		}},
	{Category: "handoff-webhook", ID: "webhook-ca-expiry", Description: "its CA is valid for 30 days or more", Live: true, Warning: true, Needs: []string{"webhook-ca-bundle"},
		Run: func(_ context.Context, e *checkEnv) (string, error) {
			return "", eachWebhook(e, func(h admissionregistrationv1.MutatingWebhook) error {
				certs, _ := caCerts(h)
				for _, c := range certs {
					if left := c.NotAfter.Sub(e.now); left < 30*24*time.Hour {
						return fmt.Errorf("its CA %q ends %s, in %s: the webhook renews its own (cert rotation) once it is near its end; with cert-manager, check its Certificate", c.Subject.CommonName, c.NotAfter.Format(time.RFC3339), left.Round(time.Hour))
					}
				}
				return nil
			})
		}},
	{Category: "handoff-webhook", ID: "webhook-endpoints", Description: "its Service has a ready endpoint", Live: true, Needs: []string{"webhook-config"},
		Run: checkEndpoints},
	{Category: "handoff-webhook", ID: "webhook-injects", Description: "the API server has it inject a pod labelled " + inject.LabelInject + "=true (a server-side dry run)", Live: true, Needs: []string{"webhook-config"},
		Run: checkDryRun},
	{Category: "handoff-workloads", ID: "pods-injected", Description: "every pod labelled " + inject.LabelInject + "=true runs the sidecar", Live: true, Needs: []string{"api-reachable"},
		Run: checkPodsInjected},
	{Category: "handoff-workloads", ID: "sidecar-versions", Description: "no sidecar is older than the webhook", Live: true, Warning: true, Needs: []string{"pods-injected"},
		Run: checkSidecarVersions},
	{Category: "handoff-workloads", ID: "lease-rbac", Description: "each injected pod's service account may update and patch its Leases and no other, and patch pods/status", Live: true, Needs: []string{"pods-injected"},
		Run: checkLeaseRBAC},
	{Category: "handoff-workloads", ID: "budgets", Description: "each injected pod's time budgets can work", Live: true, Needs: []string{"pods-injected"},
		Run: checkBudgets},
	{Category: "handoff-workloads", ID: "deletion-cost", Description: "each pod opted in to pod-deletion-cost has one", Live: true, Warning: true, Needs: []string{"pods-injected"},
		Run: checkDeletionCost},
}

// handoffPartOf selects the chart's objects.
const handoffPartOf = "app.kubernetes.io/part-of=handoff"

func findWebhookConfigs(ctx context.Context, e *checkEnv) error {
	list, err := e.client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: handoffPartOf})
	if err != nil {
		return err
	}
	e.configs = list.Items
	return nil
}

func configNames(cs []admissionregistrationv1.MutatingWebhookConfiguration) string {
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	return strings.Join(names, ", ")
}

// eachWebhook runs f on each webhook of the configurations found, and
// joins its errors, each prefixed with the webhook's name.
func eachWebhook(e *checkEnv, f func(admissionregistrationv1.MutatingWebhook) error) error {
	var errs []error
	for _, c := range e.configs {
		for _, h := range c.Webhooks {
			if err := f(h); err != nil {
				errs = append(errs, fmt.Errorf("%s webhook %s: %w", c.Name, h.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

func caCerts(h admissionregistrationv1.MutatingWebhook) ([]*x509.Certificate, error) {
	if len(h.ClientConfig.CABundle) == 0 {
		return nil, errors.New("its caBundle is empty: the API server cannot verify the webhook (the webhook writes it once it has made its certificate; is it running?)")
	}
	certs, err := certutil.ParseCertsPEM(h.ClientConfig.CABundle)
	if err != nil {
		return nil, fmt.Errorf("its caBundle is not a PEM certificate: %w", err)
	}
	return certs, nil
}

func checkEndpoints(ctx context.Context, e *checkEnv) (string, error) {
	var details []string
	err := eachWebhook(e, func(h admissionregistrationv1.MutatingWebhook) error {
		s := h.ClientConfig.Service
		if s == nil {
			details = append(details, "by URL: no Service")
			return nil
		}
		eps, err := e.client.DiscoveryV1().EndpointSlices(s.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + s.Name})
		if err != nil {
			return err
		}
		ready := 0
		for _, sl := range eps.Items {
			for _, ep := range sl.Endpoints {
				if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
					ready++
				}
			}
		}
		if ready == 0 {
			return fmt.Errorf("the Service %s/%s has no ready endpoint: is the webhook's Deployment available?", s.Namespace, s.Name)
		}
		details = append(details, fmt.Sprintf("%s/%s: %d ready", s.Namespace, s.Name, ready))
		return nil
	})
	return strings.Join(details, "; "), err
}

// checkDryRun creates a pod labelled for injection with a server-side dry
// run and checks that it comes back with the sidecar.
func checkDryRun(ctx context.Context, e *checkEnv) (string, error) {
	ns := e.dryRunNamespace
	nsObj, err := e.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	selected := false
	_ = eachWebhook(e, func(h admissionregistrationv1.MutatingWebhook) error {
		sel, err := metav1.LabelSelectorAsSelector(h.NamespaceSelector)
		if err == nil && (h.NamespaceSelector == nil || sel.Matches(labels.Set(nsObj.Labels))) {
			selected = true
		}
		return nil
	})
	if !selected {
		return "", fmt.Errorf("namespace %s is not selected by the webhook's namespaceSelector: check another with -n, or add the namespace to the chart's", ns)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "handoff-check-", Labels: map[string]string{inject.LabelInject: "true"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "handoff-check:dry-run"}}},
	}
	got, err := e.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return "", fmt.Errorf("the dry run in namespace %s was refused: %w", ns, err)
	}
	if got.Annotations[inject.AnnotationStatus] != inject.StatusInjected {
		return "", fmt.Errorf("a pod labelled %s=true in namespace %s came back without the sidecar: the API server did not reach the webhook, or it skipped the pod (with failurePolicy Ignore, such pods start without handoff)", inject.LabelInject, ns)
	}
	return "in namespace " + ns + ", version " + got.Annotations[inject.AnnotationVersion], nil
}

// listLabelled lists the pods labelled for injection and not finished, in
// e.namespace.
func listLabelled(ctx context.Context, e *checkEnv) ([]corev1.Pod, error) {
	var out []corev1.Pod
	opts := metav1.ListOptions{LabelSelector: inject.LabelInject + "=true", FieldSelector: notFinished, Limit: listPage}
	for {
		list, err := e.client.CoreV1().Pods(e.namespace).List(ctx, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, list.Items...)
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}

func checkPodsInjected(ctx context.Context, e *checkEnv) (string, error) {
	pods, err := listLabelled(ctx, e)
	if err != nil {
		return "", err
	}
	var missing []string
	e.pods = nil
	for _, p := range pods {
		if p.Labels[inject.LabelInjected] == "true" {
			e.pods = append(e.pods, p)
		} else {
			missing = append(missing, p.Namespace+"/"+p.Name)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("%d pods run without the sidecar: %s (they started while the webhook was unreachable, or it skipped them; delete them once check passes webhook-injects)", len(missing), truncList(missing))
	}
	return fmt.Sprintf("%d injected", len(e.pods)), nil
}

func truncList(s []string) string {
	if len(s) > 10 {
		return strings.Join(s[:10], ", ") + fmt.Sprintf(" and %d more", len(s)-10)
	}
	return strings.Join(s, ", ")
}

func checkSidecarVersions(ctx context.Context, e *checkEnv) (string, error) {
	hooks := webhookVersions(ctx, e.client, "", webhookSelector)
	if hooks.Error != "" {
		return "", fmt.Errorf("%w: the webhook's pods: %s", errSkip, hooks.Error)
	}
	newest := ""
	for _, v := range hooks.Versions {
		if semver.IsValid(v.Version) && (newest == "" || semver.Compare(v.Version, newest) > 0) {
			newest = v.Version
		}
	}
	if newest == "" {
		return "", fmt.Errorf("%w: no webhook pod with a version", errSkip)
	}
	var old []string
	for _, p := range e.pods {
		if v := p.Annotations[inject.AnnotationVersion]; !semver.IsValid(v) || semver.Compare(v, newest) < 0 {
			old = append(old, fmt.Sprintf("%s/%s (%s)", p.Namespace, p.Name, cmp.Or(v, unknownVersion)))
		}
	}
	if len(old) > 0 {
		return "", fmt.Errorf("the webhook is %s; %d pods run an older sidecar: %s (a rollout restart of their workloads injects the webhook's)", newest, len(old), truncList(old))
	}
	return "webhook " + newest, nil
}

// checkLeaseRBAC asks, for each injected pod's service account and
// Leases, whether it may update and patch each Lease (an election updates,
// the release of a Lease left held patches), whether it may update a Lease
// it does not name (it must not), and whether it may patch pods/status
// (the sidecar's phase condition and pod-deletion-cost on its own pod;
// the chart's admission policy keeps it to its own).
func checkLeaseRBAC(ctx context.Context, e *checkEnv) (string, error) {
	type account struct{ ns, sa string }
	leases := map[account]map[string]bool{}
	for i := range e.pods {
		p := &e.pods[i]
		c := podConfig(p)
		a := account{p.Namespace, cmp.Or(p.Spec.ServiceAccountName, "default")}
		if leases[a] == nil {
			leases[a] = map[string]bool{}
		}
		for _, l := range append(slices.Clone(c.leases), c.shardLeases...) {
			leases[a][l] = true
		}
	}
	var errs []error
	checked := 0
	// In order, so that the same cluster gives the same output.
	accounts := slices.SortedFunc(maps.Keys(leases), func(x, y account) int { return cmp.Or(strings.Compare(x.ns, y.ns), strings.Compare(x.sa, y.sa)) })
	for _, a := range accounts {
		names := leases[a]
		if len(names) == 0 {
			continue
		}
		user := "system:serviceaccount:" + a.ns + ":" + a.sa
		groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + a.ns, "system:authenticated"}
		may := func(attrs authorizationv1.ResourceAttributes) (bool, error) {
			attrs.Namespace = a.ns
			r, err := e.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: groups, ResourceAttributes: &attrs,
			}}, metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			return r.Status.Allowed, nil
		}
		allowed := func(verb, name string) (bool, error) {
			return may(authorizationv1.ResourceAttributes{Verb: verb, Group: "coordination.k8s.io", Resource: "leases", Name: name})
		}
		for _, verb := range []string{"update", "patch"} {
			var denied []string
			for _, l := range slices.Sorted(maps.Keys(names)) {
				ok, err := allowed(verb, l)
				if err != nil {
					return "", err
				}
				if !ok {
					denied = append(denied, l)
				}
			}
			if len(denied) > 0 {
				errs = append(errs, fmt.Errorf("%s/%s may not %s its Leases %s: the chart's rbac.sidecarBindings entry for it is missing, names other Leases, or is from a chart older than this handoff", a.ns, a.sa, verb, strings.Join(denied, ", ")))
			}
		}
		if ok, err := may(authorizationv1.ResourceAttributes{Verb: "patch", Resource: "pods", Subresource: "status"}); err != nil {
			return "", err
		} else if !ok {
			errs = append(errs, fmt.Errorf("%s/%s may not patch pods/status: its sidecars cannot publish their phase (handoff status) or keep pod-deletion-cost; the chart's rbac.sidecarBindings entry for it is missing or from a chart older than this handoff", a.ns, a.sa))
		}
		other := "handoff-check-not-a-lease-of-" + a.sa
		if ok, err := allowed("update", other); err != nil {
			return "", err
		} else if ok {
			errs = append(errs, fmt.Errorf("%s/%s may update Leases it does not name (%s among them): a Role grants it Leases by no name", a.ns, a.sa, other))
		}
		checked++
	}
	return fmt.Sprintf("%d service accounts", checked), errors.Join(errs...)
}

// checkBudgets loads each injected pod's sidecar settings as the sidecar
// does (so the relations between lease duration, renew deadline and retry
// period are checked), and checks its grace period against deadline-margin
// plus handback-reserve.
func checkBudgets(_ context.Context, e *checkEnv) (string, error) {
	var errs []error
	for i := range e.pods {
		p := &e.pods[i]
		// The pod's identity (downward API references in its environment)
		// and a token file (never read here) first, then its sidecar's
		// environment, as the sidecar loads it.
		identity := map[string]string{"pod-name": p.Name, "pod-namespace": p.Namespace, "pod-uid": string(p.UID), "token-file": "/dev/null"}
		s, err := config.Load(config.Map(identity, "the pod"), config.Environ(sidecarEnv(p)))
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err))
			continue
		}
		grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
		if p.Spec.TerminationGracePeriodSeconds != nil {
			grace = *p.Spec.TerminationGracePeriodSeconds
		}
		if need := s.DeadlineMargin + s.HandbackReserve; time.Duration(grace)*time.Second <= need {
			errs = append(errs, fmt.Errorf("pod %s/%s: terminationGracePeriodSeconds %d leaves no time to drain: deadline-margin %s plus handback-reserve %s is %s", p.Namespace, p.Name, grace, s.DeadlineMargin, s.HandbackReserve, need))
		}
	}
	return fmt.Sprintf("%d pods", len(e.pods)), errors.Join(errs...)
}

// costGrace is how long an opted-in pod's sidecar may run without the
// pod having a pod-deletion-cost: it writes one at its first poll (2 s),
// and a failed write again within its bound on writes (3, then one per 10 s).
const costGrace = time.Minute

// checkDeletionCost finds the pods opted in to pod-deletion-cost
// (protocol.DeletionCostOptIn) whose sidecar has run for costGrace while
// the pod has none: their sidecars cannot write it, and a scale-in ranks
// them as Kubernetes does, busy or not.
func checkDeletionCost(_ context.Context, e *checkEnv) (string, error) {
	opted := 0
	var missing []string
	for i := range e.pods {
		p := &e.pods[i]
		if p.Annotations[protocol.DeletionCostOptIn] != "true" {
			continue
		}
		opted++
		if _, ok := p.Annotations[corev1.PodDeletionCost]; ok || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		// A native sidecar is an init container; the legacy layout's, a container.
		for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			if cs.Name == inject.SidecarName && cs.State.Running != nil && e.now.Sub(cs.State.Running.StartedAt.Time) >= costGrace {
				missing = append(missing, p.Namespace+"/"+p.Name)
			}
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("of the pods opted in to pod-deletion-cost (%s: \"true\"), %d of %d have none after their sidecar ran %s: %s; "+
			"their sidecars cannot or do not write it (a failed write is in the sidecar's log and handoff_deletion_cost_writes_total{result=\"failed\"}; "+
			"a sidecar injected before the pod was annotated does not try)",
			protocol.DeletionCostOptIn, len(missing), opted, costGrace, truncList(missing))
	}
	return fmt.Sprintf("pods opted in: %d", opted), nil
}

// checkInstallRights asks whether the caller may create what the chart
// installs (SelfSubjectAccessReview).
func checkInstallRights(ctx context.Context, e *checkEnv) (string, error) {
	type res struct{ group, resource string }
	var missing []string
	for _, r := range []res{
		{"admissionregistration.k8s.io", "mutatingwebhookconfigurations"},
		{"admissionregistration.k8s.io", "validatingadmissionpolicies"},
		{"admissionregistration.k8s.io", "validatingadmissionpolicybindings"},
		{"rbac.authorization.k8s.io", "clusterroles"},
		{"rbac.authorization.k8s.io", "clusterrolebindings"},
		{"rbac.authorization.k8s.io", "roles"},
		{"rbac.authorization.k8s.io", "rolebindings"},
		{"apps", "deployments"},
		{"", "services"},
		{"", "secrets"},
		{"", "serviceaccounts"},
		{"networking.k8s.io", "networkpolicies"},
	} {
		ssar, err := e.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: e.namespace, Verb: "create", Group: r.group, Resource: r.resource},
		}}, metav1.CreateOptions{})
		if err != nil {
			return "", err
		}
		if !ssar.Status.Allowed {
			missing = append(missing, strings.TrimPrefix(r.group+"/"+r.resource, "/"))
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("you may not create %s: install as a cluster admin", strings.Join(missing, ", "))
	}
	return "", nil
}
