package sidecar

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/handoff-dev/handoff/internal/outcome"
)

// Reasons of the Kubernetes Events the sidecar records on its Pod.
const (
	ReasonLeaseAcquired = "LeaseAcquired"
	ReasonLeaseLost     = "LeaseLost"
	// The shutdown sequence's, by its steps (docs/architecture.md, "The
	// shutdown sequence"): DrainStarted at step 2 (stop claiming), Drained
	// at step 3, DrainDeadlineExceeded at step 4 (the fallback, with the
	// claims returned), LeaseReleased, LeaseReleaseWithheld and
	// HandoverFailed (a Lease not released) at step 5.
	ReasonDrainStarted     = "DrainStarted"
	ReasonDrained          = "Drained"
	ReasonDeadlineExceeded = "DrainDeadlineExceeded"
	ReasonClaimsReturned   = "ClaimsReturned"
	ReasonLeaseReleased    = "LeaseReleased"
	ReasonReleaseWithheld  = "LeaseReleaseWithheld"
	ReasonHandoverFailed   = "HandoverFailed"
	// ReasonShutdownFinished at step 6: the sequence is over; its
	// annotation handoff.dev/shutdown-summary holds its outcome, steps,
	// claims and Lease results (internal/outcome), which the webhook's
	// outcome counter turns into handoff_handovers_total and the other
	// handoff_handover_* series.
	ReasonShutdownFinished = outcome.Reason
	// ReasonRearmed: a new worker process is up after a kill of the worker
	// container, and the sidecar rejoined its elections.
	ReasonRearmed = "Rearmed"
	// ReasonSidecarRestart: SIGTERM reached the sidecar alone in a pod that
	// stays (the kubelet restarts the native sidecar): the worker and its
	// leadership go on, the Leases are kept for the next sidecar process.
	ReasonSidecarRestart = "SidecarRestart"
	// ReasonLeaseBudgetExceeded: at start, the Lease client's rate budget
	// cannot keep every configured Lease renewed within its renew deadline
	// (leaderelection.ClientBudget): some will be lost.
	ReasonLeaseBudgetExceeded = "LeaseBudgetExceeded"
	// ReasonShardShed: a shard this pod held was revoked and released while
	// it runs, as the shard set's assignment gave it to another pod.
	ReasonShardShed = "ShardShed"
	// ReasonShardShedSlow: a shed shard's election had not ended (its
	// release not done) twice the request timeout after its shed; the shard
	// counts against the pod's share until it has.
	ReasonShardShedSlow = "ShardShedSlow"
)

// CorrelatorOptions are the options of the Event broadcaster's correlator
// (record.WithCorrelatorOptions) for a sidecar: client-go's defaults, but
// that a ShutdownFinished Event is never folded into another one nor
// throttled with the pod's other Events.
//
// By default client-go's correlator combines more than 10 Events of one
// reason on one object within 10 minutes into one "(combined from similar
// events)" Event, which keeps no annotations; and lets a source write 25
// Events of one type on an object, then one each 5 minutes, whatever
// their reasons. A pod that re-arms often, or holds many shards, would
// then lose the summaries that the webhook's outcome counter reads. Here a
// ShutdownFinished Event is aggregated only with itself (its message,
// which names its sequence's start, is unique), and has its own
// throttling bucket: 25 sequences, then one each 5 minutes.
func CorrelatorOptions() record.CorrelatorOptions {
	return record.CorrelatorOptions{
		KeyFunc: func(e *corev1.Event) (string, string) {
			aggregate, local := record.EventAggregatorByReasonFunc(e)
			if e.Reason == ReasonShutdownFinished {
				aggregate += local
			}
			return aggregate, local
		},
		SpamKeyFunc: func(e *corev1.Event) string {
			key := strings.Join([]string{e.Source.Component, e.Source.Host, e.InvolvedObject.Kind, e.InvolvedObject.Namespace,
				e.InvolvedObject.Name, string(e.InvolvedObject.UID), e.InvolvedObject.APIVersion, e.Type}, "")
			if e.Reason == ReasonShutdownFinished {
				key += "\x00" + e.Reason
			}
			return key
		},
	}
}
