// Package check is the check command: checks of a handoff installation
// against the cluster, as linkerd check runs them. The checks are data
// (checks.go, one table), run and printed by one runner (runner.go); each
// check's work is a function of the cluster it reads (cluster.go; the
// require-injection policy's, refused.go, with its pure parts apart).
package check

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/kube"
)

const checkLong = `check runs checks of a handoff installation against the cluster of the
kubeconfig, as linkerd check does: grouped, each one passed (√), failed (×)
or a warning (‼), with a hint and a link to docs/checks.md for each one that
did not pass; it exits non-zero when a check failed (warnings do not).

Without --pre, the live checks: the API server and its version; the
webhook's MutatingWebhookConfiguration (label app.kubernetes.io/part-of=
handoff), its caBundle and its expiry, its Service's ready endpoints, its
require-injection ValidatingAdmissionPolicy and binding (a warning when a
webhook that fails open has none); a server-side dry run of a pod labelled
handoff.dev/inject=true in -n's namespace, which must come back injected
(with failurePolicy Ignore, a webhook the API server cannot reach lets
pods start without the sidecar, and only this shows it); then, for -n's
namespace (all with -A): the workloads whose pods the require-injection
policy refused in the last 30 minutes (their FailedCreate Events) and that
still wait for them, pods labelled for injection that run without the sidecar,
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

// Command is the check command.
var Command = command.Command{
	Use:   "check",
	Short: "Check a handoff installation (or, with --pre, a cluster before installing)",
	Long:  checkLong,
	Setup: func(f *pflag.FlagSet) func(command.Invocation) error {
		var (
			pre, all bool
			format   string
			kf       kube.Flags
		)
		f.BoolVar(&pre, "pre", false, "check the cluster before installing handoff")
		f.StringVarP(&format, "output", "o", "", "json (the shape above); text without it")
		kf.Add(f, "namespace of the workloads checked and of the dry-run pod; empty: the context's, else default")
		f.BoolVarP(&all, "all-namespaces", "A", false, "check the injected pods of every namespace (the dry run stays in -n's)")
		return func(inv command.Invocation) error {
			var errs []error
			if format != "" && format != "json" {
				errs = append(errs, fmt.Errorf("--output %q: want json, or none for text", format))
			}
			if err := errors.Join(append(errs, kf.Check())...); err != nil {
				return err
			}
			client, ns, err := kf.Client(checkTimeout)
			if err != nil {
				return err
			}
			e := &checkEnv{client: client, namespace: ns, dryRunNamespace: ns, now: time.Now()}
			if all {
				e.namespace = ""
			}
			r := runChecks(inv.Ctx, e, healthChecks, pre)
			if err := writeChecks(inv.Out, r, format); err != nil {
				return err
			}
			if !r.Success {
				return errors.New("a check failed")
			}
			return nil
		}
	},
}
