package check

import (
	"strings"

	"github.com/handoff-dev/handoff/inject"
)

// healthChecks are every check, in the order they run and print.
var healthChecks = []healthCheck{
	{Category: "kubernetes-api", ID: "api-reachable", Description: "can reach the API server", Pre: true, Live: true,
		Run: checkAPIReachable},
	{Category: "kubernetes-api", ID: "kubernetes-version", Description: "Kubernetes is " + strings.TrimSuffix(minKubernetes, ".0") + " or later (native sidecars, ValidatingAdmissionPolicy)",
		Pre: true, Live: true, Needs: []string{"api-reachable"},
		Run: checkKubernetesVersion},
	{Category: "pre-install", ID: "install-rights", Description: "you may create what the chart installs", Pre: true, Needs: []string{"api-reachable"},
		Run: checkInstallRights},
	{Category: "pre-install", ID: "no-webhook-yet", Description: "no handoff webhook is installed yet", Pre: true, Warning: true, Needs: []string{"api-reachable"},
		Run: checkNoWebhookYet},
	{Category: "handoff-webhook", ID: "webhook-config", Description: "the webhook's MutatingWebhookConfiguration exists", Live: true, Needs: []string{"api-reachable"},
		Run: checkWebhookConfig},
	{Category: "handoff-webhook", ID: "webhook-ca-bundle", Description: "its caBundle holds a CA certificate valid now", Live: true, Needs: []string{"webhook-config"},
		Run: checkCABundle},
	{Category: "handoff-webhook", ID: "webhook-ca-expiry", Description: "its CA is valid for 30 days or more", Live: true, Warning: true, Needs: []string{"webhook-ca-bundle"},
		Run: checkCAExpiry},
	{Category: "handoff-webhook", ID: "webhook-endpoints", Description: "its Service has a ready endpoint", Live: true, Needs: []string{"webhook-config"},
		Run: checkEndpoints},
	{Category: "handoff-webhook", ID: "require-injection-policy", Description: "a webhook that fails open has its require-injection policy and binding (webhook.requireInjection)", Live: true, Warning: true, Needs: []string{"webhook-config"},
		Run: checkRequireInjectionPolicy},
	{Category: "handoff-webhook", ID: "webhook-injects", Description: "the API server has it inject a pod labelled " + inject.LabelInject + "=true (a server-side dry run)", Live: true, Needs: []string{"webhook-config"},
		Run: checkDryRun},
	{Category: "handoff-workloads", ID: "pods-injected", Description: "every pod labelled " + inject.LabelInject + "=true runs the sidecar", Live: true, Needs: []string{"api-reachable"},
		Run: checkPodsInjected},
	{Category: "handoff-workloads", ID: "pods-not-refused", Description: "no workload waits for pods the require-injection policy refuses (FailedCreate Events of the last " + refusedWindowText + ")", Live: true, Needs: []string{"api-reachable"},
		Run: checkPodsNotRefused},
	{Category: "handoff-workloads", ID: "sidecar-versions", Description: "no sidecar is older than the webhook", Live: true, Warning: true, Needs: []string{"pods-injected"},
		Run: checkSidecarVersions},
	{Category: "handoff-workloads", ID: "lease-rbac", Description: "each injected pod's service account may update and patch its Leases and no other, and patch pods/status", Live: true, Needs: []string{"pods-injected"},
		Run: checkLeaseRBAC},
	{Category: "handoff-workloads", ID: "budgets", Description: "each injected pod's time budgets can work", Live: true, Needs: []string{"pods-injected"},
		Run: checkBudgets},
	{Category: "handoff-workloads", ID: "deletion-cost", Description: "each pod opted in to pod-deletion-cost has one", Live: true, Warning: true, Needs: []string{"pods-injected"},
		Run: checkDeletionCost},
}
