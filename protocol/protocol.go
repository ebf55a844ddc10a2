// Package protocol defines the wire format between the handoff sidecar and
// the app (the worker) it coordinates, both on loopback. docs/protocol.yaml
// is the same contract in OpenAPI.
//
// The sidecar serves the control API (ControlPrefix) and calls the app's
// API (AppPrefix); every body is JSON. Durations are integer milliseconds,
// times are RFC 3339 with nanoseconds.
package protocol

import "time"

// Paths of the sidecar's control API.
const (
	ControlPrefix = "/v1/"
	// PreStopPath (POST) starts the shutdown sequence, or joins the one under
	// way, and answers with its Report when it is over.
	PreStopPath = "/v1/prestop"
	// StatusPath (GET) answers with Status.
	StatusPath = "/v1/status"
)

// Paths of the app's API, served by the worker package's handler.
const (
	AppPrefix = "/handoff/v1/"
	// StopClaimingPath (POST): the app stops claiming new work; idempotent.
	// Answers DrainStatus.
	StopClaimingPath = "/handoff/v1/stop-claiming"
	// DrainPath (GET ?waitMillis=N): answers DrainStatus once the app is
	// drained or N ms have passed, whichever is first. N is a whole number
	// of milliseconds, 0 or more (absent or empty: 0); above 30000, of any
	// size, it is 30000; anything else is answered 400.
	DrainPath = "/handoff/v1/drain"
	// ReturnPath (POST ReturnRequest): the app hands back every unfinished
	// claim. Answers ReturnResult.
	ReturnPath = "/handoff/v1/return"
	// LeasePathPrefix + Lease name (PUT Leadership): leadership of one Lease.
	// A Leadership with Leader false is answered only once the app's leader
	// work for that Lease has stopped (the ack).
	LeasePathPrefix = "/handoff/v1/leases/"
)

// DrainStatus is the app's count of work it has claimed and not finished.
type DrainStatus struct {
	// Stopping says claiming has stopped (stop-claiming was called).
	Stopping bool `json:"stopping"`
	// InFlight counts the claims held: messages received and not yet
	// finished or handed back.
	InFlight int `json:"inFlight"`
	// Unstarted counts the claims among InFlight held but not started:
	// the rest of a batch, prefetched or buffered messages. The app hands
	// them back at stop-claiming, not at the drain deadline, so after it
	// this only goes down; InFlight - Unstarted is the work in progress.
	// Apps that do not tell started from unstarted work send 0 (or leave
	// it out): all of InFlight is then in progress.
	Unstarted int `json:"unstarted,omitempty"`
	// Receiving counts the waits for a message still pending; none holds a
	// claim. Stop-claiming ends them, so after it this only goes down.
	// Apps that do not count waits send 0 (or leave it out).
	Receiving int `json:"receiving"`
	// RunningMillis is how long the oldest claim in progress (of InFlight -
	// Unstarted) has been in progress, in milliseconds on the app's clock;
	// 0 with none. The sidecar reads it while the pod runs to rank the pod
	// for scale-in (setting deletion-cost: the longer the work, the dearer
	// the pod). Apps that do not time their claims send 0 (or leave it out).
	RunningMillis int64 `json:"runningMillis,omitempty"`
	// Drained is InFlight == 0 and Receiving == 0.
	Drained bool `json:"drained"`
	// Instance names this app process: any string, the same for every
	// answer of one process and new for each process (the Go worker
	// package: 16 random hex digits, made at worker.New). The sidecar
	// re-arms after a kill of the worker container only for an instance
	// other than the one that drained, so that the old process, still up
	// until the kubelet's SIGTERM, is never taken for the new one. Apps that
	// leave it out are taken for new once they answer not stopping.
	Instance string `json:"instance,omitempty"`
}

// ReturnRequest asks the app to hand back its unfinished claims. With Cancel
// the app first cancels in-flight work and waits up to CancelWaitMillis for
// it to end, then hands back every message it claimed and did not
// acknowledge: those still held, and those whose work ended because of the
// cancel without acknowledging them. CancelWaitMillis is 0 or more (a
// negative one is answered 400); the sidecar always sends Cancel, and
// CancelWaitMillis when not 0.
type ReturnRequest struct {
	Cancel           bool  `json:"cancel"`
	CancelWaitMillis int64 `json:"cancelWaitMillis,omitempty"`
}

// ReturnResult says how many claims the app handed back; Error is set when
// it could not hand back all of them.
type ReturnResult struct {
	Returned int    `json:"returned"`
	Error    string `json:"error,omitempty"`
}

// Leadership tells the app whether it leads a Lease. A leader may act for
// the Lease until Until and for no longer than ValidForMillis from receipt,
// whichever ends first, unless renewed by a later Leadership. FencingToken is
// the Lease's transition count at acquisition (0 for the first holder of a
// new Lease): it grows with each new holder, so systems the leader writes to
// can refuse a stale one. Sequence grows with every message the sidecar
// sends about the Lease (it is the send time in Unix nanoseconds, kept
// strictly increasing, so it also grows across sidecar restarts); the app
// ignores one not above the last it applied, so a delayed grant never
// overtakes a revoke.
type Leadership struct {
	Lease          string    `json:"lease"`
	Leader         bool      `json:"leader"`
	Sequence       int64     `json:"sequence"`
	HolderIdentity string    `json:"holderIdentity,omitempty"`
	FencingToken   int64     `json:"fencingToken"`
	Until          time.Time `json:"until,omitzero"`
	ValidForMillis int64     `json:"validForMillis,omitempty"`
}

// Outcome is how the drain ended.
type Outcome string

// Outcomes of the drain, as recorded in Report.Outcome.
const (
	OutcomeDrained   Outcome = "Drained"   // the app reported drained in time
	OutcomeReturned  Outcome = "Returned"  // deadline: unfinished claims handed back
	OutcomeCanceled  Outcome = "Canceled"  // deadline: in-flight work canceled, then handed back
	OutcomeAbandoned Outcome = "Abandoned" // deadline: left to the visibility timeout
	OutcomeAppGone   Outcome = "AppGone"   // the app did not answer: nothing to drain
)

// Outcomes returns every Outcome, in the order declared above: the label
// values of handoff_shutdowns_total, which the sidecar exports at 0 from
// its start so that a rate over a pod's only sequence sees it.
func Outcomes() []Outcome {
	return []Outcome{OutcomeDrained, OutcomeReturned, OutcomeCanceled, OutcomeAbandoned, OutcomeAppGone}
}

// StepName names a step of the shutdown sequence.
type StepName string

// Steps of the shutdown sequence, in the order they are recorded, each
// with the number of the step it marks (docs/architecture.md, "The
// shutdown sequence": 1 deadline, 2 stop claiming, 3 wait for the drain,
// 4 fallback, 5 revoke and release, 6 answer the hook).
const (
	StepTriggered     StepName = "triggered"          // a trigger started the sequence (before step 1)
	StepStopClaiming  StepName = "stop-claiming"      // step 2: the app answered stop-claiming
	StepDrained       StepName = "drained"            // step 3: the app drained, or went away
	StepDrainDeadline StepName = "drain-deadline"     // step 3 ended with work in flight: step 4 follows
	StepClaimsHandled StepName = "claims-handled"     // step 4: the fallback returned (or canceled) claims
	StepRevoked       StepName = "leadership-revoked" // step 5: the app acknowledged the end of its leadership
	StepReleased      StepName = "lease-released"     // step 5: a Lease this pod led was released (or not: see detail)
	StepDone          StepName = "done"               // step 6: the report is final and answers the hook
)

// Steps returns every StepName, in the order they are recorded.
func Steps() []StepName {
	return []StepName{StepTriggered, StepStopClaiming, StepDrained, StepDrainDeadline, StepClaimsHandled, StepRevoked, StepReleased, StepDone}
}

// Trigger names what started a shutdown sequence.
type Trigger string

// Triggers of a sequence, as recorded in Report.Trigger.
const (
	TriggerPreStop Trigger = "preStop" // the worker container's preStop hook
	TriggerSignal  Trigger = "SIGTERM" // SIGTERM to the sidecar, when no hook ran
	// TriggerDeletion: the sidecar's watch of its own Pod saw its
	// deletionTimestamp set, about 0.1 s before the kubelet runs the hook,
	// which then joins the sequence.
	TriggerDeletion Trigger = "deletion"
)

// LeaseKind is what a Lease guards, which decides when the shutdown
// sequence hands it over.
type LeaseKind string

// Kinds of Lease, as shown in LeaseRelease.Kind and LeaseStatus.Kind.
const (
	// LeaseKindPartition guards a partition of the work (the worker's
	// claims come from it): released after the drain, so no successor
	// claims work this pod still does. The default.
	LeaseKindPartition LeaseKind = "partition"
	// LeaseKindRole guards a role (a scheduled or singleton job): revoked
	// and released as soon as the sequence starts, right after
	// stop-claiming.
	LeaseKindRole LeaseKind = "role"
)

// Step is one timed step of the shutdown sequence.
type Step struct {
	Name   StepName  `json:"name"`
	At     time.Time `json:"at"`
	Detail string    `json:"detail,omitempty"`
}

// LeaseRelease is what happened to one Lease at shutdown.
type LeaseRelease struct {
	Lease     string    `json:"lease"`
	Kind      LeaseKind `json:"kind"`
	WasLeader bool      `json:"wasLeader"`
	Released  bool      `json:"released"`
	// ReleasedAt is when the release was written; zero when not released.
	ReleasedAt time.Time `json:"releasedAt,omitzero"`
	Detail     string    `json:"detail,omitempty"`
}

// Report is the result of one shutdown sequence.
type Report struct {
	Trigger  Trigger   `json:"trigger"` // "preStop", "SIGTERM" or "deletion"
	Started  time.Time `json:"started"`
	Deadline time.Time `json:"deadline"`
	// DeadlineSource is "deletionTimestamp" or "gracePeriod".
	DeadlineSource     string  `json:"deadlineSource"`
	Outcome            Outcome `json:"outcome"`
	InFlightAtDeadline int     `json:"inFlightAtDeadline"`
	// UnstartedAtStopClaiming is how many claims the app held and had not
	// started at stop-claiming (DrainStatus.Unstarted): the app hands them
	// back at once, not at the deadline. Omitted when 0.
	UnstartedAtStopClaiming int `json:"unstartedAtStopClaiming,omitempty"`
	Returned                int `json:"returned"`
	// Abandoned is how many claims were left to the visibility timeout, as
	// far as the sidecar can know: under fallback abandon, the count in
	// flight at the deadline; when the app went away mid-drain, the last
	// in-flight count it reported. Omitted when 0.
	Abandoned int            `json:"abandoned,omitempty"`
	Leases    []LeaseRelease `json:"leases"`
	Steps     []Step         `json:"steps"`
	Finished  time.Time      `json:"finished"`
	Errors    []string       `json:"errors,omitempty"`
}

// LeadershipAck is the app's answer to a Leadership. Stale says the app
// ignored the message because it had applied a later one; the sidecar
// reads it: a stale answer to a revoke is not an ack.
type LeadershipAck struct {
	Leader bool `json:"leader"`
	Stale  bool `json:"stale,omitempty"`
}

// LeaseStatus is the sidecar's view of one Lease.
type LeaseStatus struct {
	Lease          string    `json:"lease"`
	Kind           LeaseKind `json:"kind"`
	Leader         bool      `json:"leader"`
	HolderIdentity string    `json:"holderIdentity,omitempty"`
	FencingToken   int64     `json:"fencingToken,omitempty"`
	Until          time.Time `json:"until,omitzero"`
	// ReleasedAt is when the sequence under way (or the last one) released
	// this Lease; zero when it has not.
	ReleasedAt time.Time `json:"releasedAt,omitzero"`
}

// Phase is where the sidecar is in its cycle of elections and shutdown
// sequences.
type Phase string

// Phases of the sidecar, as shown in Status.Phase.
const (
	// PhaseRunning: the elections run; a preStop starts a sequence.
	PhaseRunning Phase = "Running"
	// PhaseShuttingDown: a shutdown sequence is under way; triggers join it.
	PhaseShuttingDown Phase = "ShuttingDown"
	// PhaseRearming: a sequence for a kill of the worker container in a pod
	// that is not being deleted is over; the elections are stopped until a
	// new worker process answers and is not stopping. A trigger now starts
	// a new sequence (with no Lease to release).
	PhaseRearming Phase = "Rearming"
	// PhaseDone: the last sequence is over and the pod is leaving (being
	// deleted, or the sidecar itself was stopped); triggers get its report.
	PhaseDone Phase = "Done"
)

// PodConditionCoordinating is the condition the sidecar writes on its own
// pod's status: True while its phase is Running (a preStop would hand
// over), else False; its reason is the Phase, its message what the phase
// means now, and its lastTransitionTime when the sidecar entered it.
// `handoff status` reads the phase from it.
const PodConditionCoordinating = "handoff.dev/Coordinating"

// PodConditionShards is the condition the sidecar of a pod with a shard set
// writes on its own pod's status: the shards it holds, so that its peers,
// which watch its Pod, plan from who holds what (docs/shards.md). Status
// True, reason ReasonShardsHeld, and a message "shards R of N (set H)": R
// the indices into the shard set of the shards held, as ascending ranges
// ("0-3,7,9") or "none", N the set's size and H 8 hex digits of its
// fingerprint (package shard of the sidecar's module: EncodeHeld). It is
// written when what the pod holds changes.
const PodConditionShards = "handoff.dev/Shards"

// ReasonShardsHeld is the reason of the condition PodConditionShards.
const ReasonShardsHeld = "Held"

// DeletionCostOptIn is the pod annotation by which a pod opts in to the
// sidecar keeping its pod-deletion-cost (corev1.PodDeletionCost): the
// setting deletion-cost's annotation, "true" to opt in. The chart's
// admission policy lets a sidecar write the cost only on a pod that has it.
const DeletionCostOptIn = "handoff.dev/deletion-cost"

// Status is the sidecar's state. Report is the last sequence's.
type Status struct {
	Identity string        `json:"identity"`
	Phase    Phase         `json:"phase"`
	Leases   []LeaseStatus `json:"leases"`
	Report   *Report       `json:"report,omitempty"`
}
