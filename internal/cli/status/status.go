// Package status is the status command: what handoff does in a namespace,
// from the API server alone. Its parts: the command (status.go), the reads
// of the API (read.go), the view's types (model.go), the view built from
// the objects read (build.go, pure) and printed (render.go, pure).
package status

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/kube"
)

const statusLong = `status shows, from the API server alone (no port-forward, nothing asked of a
pod), what handoff does in a namespace: each Lease its injected pods compete
for, with its holder pod, the term it has left and its fencing token; each
shard set, with the shards each pod holds against its fair share and the
shards no pod holds; and each injected pod, with its version, its phase and
its last handover, read from the pod's Events.

  Leases   the Leases named by the injected pods' sidecars (HANDOFF_LEASES,
           HANDOFF_SHARDS as injection sets them from the handoff.dev/
           annotations). STATE is Held (its holder renews it), Free (released:
           no holder), Expired (its holder stopped renewing and its lease
           duration has passed since) or Missing (not created yet: no pod
           has led it). TERM LEFT is renewTime plus leaseDurationSeconds,
           less now; FENCING TOKEN is spec.leaseTransitions, which the
           holder's fencing token is.
  Shards   per shard set: the peers up (injected pods of the set not being
           deleted), the fair share ceil(N/M) each aims at, the shards each
           pod holds, and the shards held by none.
  Pods     PHASE is the sidecar's, as it writes it on its pod (the condition
           handoff.dev/Coordinating, within a request of each change):
           Running (a preStop would hand over), ShuttingDown (a sequence is
           under way), Rearming (a sequence is over in a pod that stays: a
           worker restart), Done (the last sequence is over, the pod is
           leaving); or the pod's phase while it is Pending. Where the
           sidecar wrote none (an older sidecar), or still says Running on a
           pod being deleted, it is inferred: Running (not being deleted),
           ShuttingDown (deletion requested, and the pod still holds a Lease
           or its drain has not ended: no Drained or DrainDeadlineExceeded
           Event yet), Done (deletion requested, every Lease released, the
           drain over). -o json says which (phaseFrom: sidecar, inferred). LAST HANDOVER is the outcome of the pod's last shutdown
           sequence and its steps, from its Events (DrainStarted, Drained,
           DrainDeadlineExceeded, LeaseReleased, ...): they carry the step
           times in milliseconds in their messages; an Event's own time has
           whole seconds. Events reach the API server within about a second
           of the step and are kept an hour by default (the API server's
           --event-ttl). -o wide adds DELETION COST: the pod's
           controller.kubernetes.io/pod-deletion-cost, which its sidecar keeps
           with handoff.dev/deletion-cost: "true" (docs/scale-in.md).

--watch prints the view again each time a Lease, an injected pod or an Event
of the namespace changes (at most twice a second), until interrupted; with -o
json, one JSON object a line.

The kubeconfig is read as kubectl reads it (--kubeconfig, KUBECONFIG,
~/.kube/config, in-cluster; --context). It needs get, list and watch on
Leases, pods and Events in the namespace. With -o json (yaml: the same) this
shape:

  {
    "time": "<RFC 3339, when read>",
    "namespace": "shop",
    "selector": "handoff.dev/injected=true",
    "leases": [{"name": "orders-leader", "kind": "role", "state": "Held",
                "holderIdentity": "orders-7d9-abcde_<pod uid>", "holderPod": "orders-7d9-abcde",
                "termLeftSeconds": 12.3, "fencingToken": 4, "renewTime": "...",
                "leaseDurationSeconds": 15}],
    "shardSets": [{"shards": "orders-{0..3}", "leases": ["orders-0", ...], "peers": 2,
                   "fairShare": 2, "owners": [{"pod": "...", "shards": ["orders-0"]}],
                   "unowned": ["orders-3"]}],
    "pods": [{"name": "...", "version": "v0.2.0", "phase": "Running", "phaseFrom": "sidecar", "ready": true,
              "deletionTimestamp": "<only while deleted>", "leases": ["orders-leader"],
              "lastHandover": {"outcome": "Drained", "steps": [{"reason": "DrainStarted",
                                "time": "...", "message": "..."}]},
              "deletionCost": 10010}],
    "warnings": ["<what could not be read in full: more than 5000 Events about pods>"]
  }`

// Command is the status command.
var Command = command.Command{
	Use:   "status",
	Short: "Show the Leases, shards, drains and last handovers of a namespace's injected pods",
	Long:  statusLong,
	Setup: func(f *pflag.FlagSet) func(command.Invocation) error {
		var (
			kf               kube.Flags
			format, selector string
			timeout          time.Duration
			watchFlag        bool
		)
		f.StringVarP(&format, "output", "o", "", "json, yaml (the shape above) or wide (more columns); text without it")
		kf.Add(f, "namespace; empty: the kubeconfig context's, else default")
		f.StringVarP(&selector, "selector", "l", "", "label selector of the workload's pods, like app=orders, besides handoff.dev/injected=true")
		f.DurationVar(&timeout, "timeout", 10*time.Second, "how long the API server may take to answer each view, in all")
		f.BoolVarP(&watchFlag, "watch", "w", false, "print the view again on every change, until interrupted")
		return func(inv command.Invocation) error {
			var errs []error
			if format != "" && format != "json" && format != "yaml" && format != "wide" {
				errs = append(errs, fmt.Errorf("--output %q: want json, yaml or wide, or none for text", format))
			}
			if timeout <= 0 {
				errs = append(errs, fmt.Errorf("--timeout %s: want a duration above 0, like 10s", timeout))
			}
			if _, err := labels.Parse(selector); err != nil {
				errs = append(errs, fmt.Errorf("--selector %q: want a label selector, like app=orders: %w", selector, err))
			}
			if err := errors.Join(append(errs, kf.Check())...); err != nil {
				return err
			}
			client, ns, err := kf.Client(timeout)
			if err != nil {
				return err
			}
			sel := kube.SidecarSelector
			if selector != "" {
				sel += "," + selector
			}
			q := statusQuery{client: client, namespace: ns, selector: sel, timeout: timeout}
			if !watchFlag {
				r, err := q.read(inv.Ctx)
				if err != nil {
					return err
				}
				return writeStatus(inv.Out, r, format)
			}
			return q.watch(inv.Ctx, func(r Report) error { return writeStatus(inv.Out, r, format) })
		}
	},
}
