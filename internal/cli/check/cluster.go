package check

import (
	"cmp"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/semver"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	kversion "k8s.io/apimachinery/pkg/version"
	certutil "k8s.io/client-go/util/cert"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/cli/kube"
	"github.com/handoff-dev/handoff/protocol"
)

// checkAPIReachable reads the API server's version, for the checks after it.
func checkAPIReachable(ctx context.Context, e *checkEnv) (string, error) {
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
}

// checkKubernetesVersion: the API server is minKubernetes or later.
func checkKubernetesVersion(_ context.Context, e *checkEnv) (string, error) {
	if e.server.LessThan(utilversion.MustParseSemantic(minKubernetes)) {
		return "", fmt.Errorf("the API server is %s", e.server)
	}
	return "", nil
}

// checkNoWebhookYet: no handoff MutatingWebhookConfiguration is installed yet.
func checkNoWebhookYet(ctx context.Context, e *checkEnv) (string, error) {
	if err := findWebhookConfigs(ctx, e); err != nil {
		return "", err
	}
	if len(e.configs) > 0 {
		return "", fmt.Errorf("found %s: an upgrade, not an install (docs/upgrading.md)", configNames(e.configs))
	}
	return "", nil
}

// checkWebhookConfig finds the handoff MutatingWebhookConfigurations.
func checkWebhookConfig(ctx context.Context, e *checkEnv) (string, error) {
	if err := findWebhookConfigs(ctx, e); err != nil {
		return "", err
	}
	if len(e.configs) == 0 {
		return "", errors.New("no MutatingWebhookConfiguration labelled " + handoffPartOf + ": install the chart")
	}
	return configNames(e.configs), nil
}

// checkCABundle: each webhook's caBundle holds CA certificates valid now.
func checkCABundle(_ context.Context, e *checkEnv) (string, error) {
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
}

// checkCAExpiry: each webhook's CA is valid for 30 days or more.
func checkCAExpiry(_ context.Context, e *checkEnv) (string, error) {
	return "", eachWebhook(e, func(h admissionregistrationv1.MutatingWebhook) error {
		certs, _ := caCerts(h)
		for _, c := range certs {
			if left := c.NotAfter.Sub(e.now); left < 30*24*time.Hour {
				return fmt.Errorf("its CA %q ends %s, in %s: the webhook renews its own (cert rotation) once it is near its end; with cert-manager, check its Certificate", c.Subject.CommonName, c.NotAfter.Format(time.RFC3339), left.Round(time.Hour))
			}
		}
		return nil
	})
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
	opts := metav1.ListOptions{LabelSelector: inject.LabelInject + "=true", FieldSelector: kube.NotFinished, Limit: kube.ListPage}
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
	hooks, err := kube.WebhookVersions(ctx, e.client, "", kube.WebhookSelector)
	if err != nil {
		return "", fmt.Errorf("%w: the webhook's pods: %w", errSkip, err)
	}
	newest := ""
	for v := range hooks {
		if semver.IsValid(v) && (newest == "" || semver.Compare(v, newest) > 0) {
			newest = v
		}
	}
	if newest == "" {
		return "", fmt.Errorf("%w: no webhook pod with a version", errSkip)
	}
	var old []string
	for _, p := range e.pods {
		if v := p.Annotations[inject.AnnotationVersion]; !semver.IsValid(v) || semver.Compare(v, newest) < 0 {
			old = append(old, fmt.Sprintf("%s/%s (%s)", p.Namespace, p.Name, cmp.Or(v, kube.UnknownVersion)))
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
		// A pod whose settings do not load names no Lease: its sidecar
		// refuses them (budgets says why).
		var names []string
		if s, err := kube.PodSettings(p, config.Annotations(p.Annotations)); err == nil {
			names = append(slices.Clone(s.Leases), s.Shards...)
		}
		a := account{p.Namespace, cmp.Or(p.Spec.ServiceAccountName, "default")}
		if leases[a] == nil {
			leases[a] = map[string]bool{}
		}
		for _, l := range names {
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
			// Self-service (the handoff-workload chart): RBAC grants every
			// Lease through the ClusterRole <release>-sidecar, and the
			// admission policy <release>-sidecar-lease-grants refuses the
			// writes of any Lease not granted hold by name.
			policy, err := selfServiceLeasePolicy(ctx, e, may)
			if err != nil {
				return "", err
			}
			if policy == "" {
				errs = append(errs, fmt.Errorf("%s/%s may update Leases it does not name (%s among them): a Role grants it Leases by no name", a.ns, a.sa, other))
			} else {
				var ungranted []string
				for _, l := range slices.Sorted(maps.Keys(names)) {
					ok, err := may(authorizationv1.ResourceAttributes{Verb: "hold", Group: "handoff.dev", Resource: "leases", Name: l})
					if err != nil {
						return "", err
					}
					if !ok {
						ungranted = append(ungranted, l)
					}
				}
				if len(ungranted) > 0 {
					errs = append(errs, fmt.Errorf("%s/%s is not granted hold on its Leases %s: the admission policy %s refuses its writes of them (name them in its handoff-workload release's leases, or in a Role granting hold on handoff.dev/leases by name)", a.ns, a.sa, strings.Join(ungranted, ", "), policy))
				}
			}
		}
		checked++
	}
	return fmt.Sprintf("%d service accounts", checked), errors.Join(errs...)
}

// leaseGrantsSuffix ends the name of the chart's self-service Lease
// policy and its binding: <fullname>-sidecar-lease-grants, where <fullname>
// names its MutatingWebhookConfiguration (sidecar-self-service.yaml).
const leaseGrantsSuffix = "-sidecar-lease-grants"

// selfServiceLeasePolicy returns the name of the admission policy that
// limits a self-service sidecar account's Lease writes to the Leases it is
// granted hold on, when may (a SubjectAccessReview as that account) says
// it holds the self-service mark (use of handoff.dev/sidecars, and not of
// handoff.dev/wildcard-probe, which only a wildcard grants) and a handoff
// webhook configuration found by webhook-config has that policy with a
// binding that denies; "" otherwise.
func selfServiceLeasePolicy(ctx context.Context, e *checkEnv, may func(authorizationv1.ResourceAttributes) (bool, error)) (string, error) {
	marked, err := may(authorizationv1.ResourceAttributes{Verb: "use", Group: "handoff.dev", Resource: "sidecars"})
	if err != nil || !marked {
		return "", err
	}
	wildcard, err := may(authorizationv1.ResourceAttributes{Verb: "use", Group: "handoff.dev", Resource: "wildcard-probe"})
	if err != nil || wildcard {
		return "", err
	}
	for _, cfg := range e.configs {
		name := cfg.Name + leaseGrantsSuffix
		if _, err := e.client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return "", err
		}
		b, err := e.client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return "", err
		}
		if b.Spec.PolicyName == name && slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny) {
			return name, nil
		}
	}
	return "", nil
}

// checkBudgets loads each injected pod's sidecar settings as the sidecar
// does (so the relations between lease duration, renew deadline and retry
// period are checked), and checks its grace period against deadline-margin
// plus handback-reserve.
func checkBudgets(_ context.Context, e *checkEnv) (string, error) {
	var errs []error
	for i := range e.pods {
		p := &e.pods[i]
		// As the sidecar loads them (kube.PodSettings).
		s, err := kube.PodSettings(p)
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
