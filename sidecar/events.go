package sidecar

// Reasons of the Kubernetes Events the sidecar records on its Pod.
const (
	ReasonLeaseAcquired    = "LeaseAcquired"
	ReasonLeaseLost        = "LeaseLost"
	ReasonDrainStarted     = "DrainStarted"
	ReasonDrained          = "Drained"
	ReasonDeadlineExceeded = "DrainDeadlineExceeded"
	ReasonClaimsReturned   = "ClaimsReturned"
	ReasonLeaseReleased    = "LeaseReleased"
	ReasonReleaseWithheld  = "LeaseReleaseWithheld"
	ReasonShutdownFailed   = "HandoverFailed"
)
