package status

import (
	"time"

	"github.com/handoff-dev/handoff/protocol"
	coord "github.com/handoff-dev/handoff/sidecar"
)

// Report is what `handoff status` prints; with -o json exactly this
// shape (statusLong).
type Report struct {
	Time      time.Time      `json:"time"`
	Namespace string         `json:"namespace"`
	Selector  string         `json:"selector"`
	Leases    []LeaseView    `json:"leases"`
	ShardSets []ShardSetView `json:"shardSets"`
	Pods      []PodView      `json:"pods"`
	// Warnings say what the view could not read in full.
	Warnings []string `json:"warnings,omitempty"`
}

// Lease states, as LeaseView.State.
const (
	leaseHeld    = "Held"
	leaseFree    = "Free"
	leaseExpired = "Expired"
	leaseMissing = "Missing"
)

// LeaseView is one Lease as status shows it.
type LeaseView struct {
	Name string             `json:"name"`
	Kind protocol.LeaseKind `json:"kind"`
	// State is Held, Free, Expired or Missing (statusLong).
	State          string `json:"state"`
	HolderIdentity string `json:"holderIdentity,omitempty"`
	// HolderPod is the injected pod whose name and UID the holder identity
	// is; "" when it is none of them.
	HolderPod string `json:"holderPod,omitempty"`
	// TermLeftSeconds is renewTime + leaseDurationSeconds - Time, in
	// seconds; 0 unless Held.
	TermLeftSeconds      float64    `json:"termLeftSeconds"`
	FencingToken         int64      `json:"fencingToken"`
	RenewTime            *time.Time `json:"renewTime,omitempty"`
	LeaseDurationSeconds int32      `json:"leaseDurationSeconds,omitempty"`
}

// ShardSetView is one set of shard Leases and who holds them.
type ShardSetView struct {
	// Shards is the set as the pods configure it (HANDOFF_SHARDS).
	Shards string   `json:"shards"`
	Leases []string `json:"leases"`
	// Peers is the number of injected pods of the set not being deleted;
	// FairShare is ceil(len(Leases)/Peers), 0 without peers.
	Peers     int          `json:"peers"`
	FairShare int          `json:"fairShare"`
	Owners    []ShardOwner `json:"owners"`
	// Unowned are the shards no pod holds (Free, Expired or Missing).
	Unowned []string `json:"unowned"`
}

// ShardOwner is the shards one pod holds.
type ShardOwner struct {
	Pod    string   `json:"pod"`
	Shards []string `json:"shards"`
}

// Pod phases, as PodView.Phase (besides the pod's own, while Pending).
const (
	phaseRunning      = string(protocol.PhaseRunning)
	phaseShuttingDown = string(protocol.PhaseShuttingDown)
	phaseRearming     = string(protocol.PhaseRearming)
	phaseDone         = string(protocol.PhaseDone)
)

// Where PodView.Phase comes from.
const (
	phaseFromSidecar = "sidecar"  // the pod's condition handoff.dev/Coordinating, which the sidecar writes
	phaseInferred    = "inferred" // the pod's deletion, its Leases and its Events (a sidecar that writes no condition)
)

// PodView is one injected pod.
type PodView struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Phase is Running, ShuttingDown, Rearming, Done, or the pod's phase
	// while it is Pending (statusLong); PhaseFrom says whether the sidecar
	// wrote it (sidecar) or the view inferred it (inferred).
	Phase             string     `json:"phase"`
	PhaseFrom         string     `json:"phaseFrom"`
	Ready             bool       `json:"ready"`
	DeletionTimestamp *time.Time `json:"deletionTimestamp,omitempty"`
	// Leases are the Leases the pod holds now (State Held), shards among
	// them.
	Leases       []string      `json:"leases"`
	LastHandover *HandoverView `json:"lastHandover,omitempty"`
	// DeletionCost is the pod's controller.kubernetes.io/pod-deletion-cost,
	// which its sidecar keeps with the setting deletion-cost
	// (docs/scale-in.md); nil when the pod has none.
	DeletionCost *int32 `json:"deletionCost,omitempty"`
}

// handoverInProgress is HandoverView.Outcome until an Event ends the
// sequence.
const handoverInProgress = "InProgress"

// handoverFailed is HandoverView.Outcome when a Lease was not released.
const handoverFailed = "Failed"

// HandoverView is a pod's last shutdown sequence, from its Events.
type HandoverView struct {
	// Outcome is Drained, Returned (or Canceled), Abandoned, Failed (a
	// Lease not released), or InProgress while no Event has ended it.
	Outcome string     `json:"outcome"`
	Steps   []StepView `json:"steps"`
}

// StepView is one Event of a handover.
type StepView struct {
	Reason  string    `json:"reason"`
	Time    time.Time `json:"time"`
	Message string    `json:"message"`
	Count   int32     `json:"count,omitempty"`
}

// handoverReasons are the reasons of the Events a shutdown sequence writes.
var handoverReasons = []string{coord.ReasonDrainStarted, coord.ReasonDrained, coord.ReasonDeadlineExceeded,
	coord.ReasonClaimsReturned, coord.ReasonLeaseReleased, coord.ReasonReleaseWithheld, coord.ReasonHandoverFailed}
