package sidecar

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
