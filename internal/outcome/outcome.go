// Package outcome is the record of one shutdown sequence that a sidecar
// writes on its Pod as the annotation of a ShutdownFinished Event, and
// that the webhook's outcome counter reads back to count handovers for
// Prometheus (docs/monitoring.md, "Handover outcomes"). It is the contract
// between the two: typed, versioned (Version) and bounded (MaxLeases,
// MaxLeaseName), so that a sidecar and a webhook of different releases
// either agree or the webhook counts the Event as unsupported.
package outcome

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// Reason is the reason of the Event a sidecar records on its Pod when a
// shutdown sequence ends (step 6), with the Summary in its annotation
// Annotation.
const Reason = "ShutdownFinished"

// Annotation is the Event annotation that holds the Summary, as JSON.
const Annotation = "handoff.dev/shutdown-summary"

// Version is the Summary's format version, its field v. A reader refuses
// any other (ErrUnsupportedVersion). A field added within a version is
// optional, and a reader of an earlier release of the same version ignores
// it (encoding/json drops fields it does not know): LeaseResult.Hops and
// LeaseResult.Successor came so. The version changes for a change an
// earlier reader would misread or refuse: a field's meaning, or a new value
// where values are listed (an outcome, a step, a result, a hop, a
// successor), which Decode refuses.
const Version = 1

// MaxLeases bounds the Leases a Summary names; the results of Leases past
// it are counted in Summary.Unnamed, by result, without their names.
const MaxLeases = 64

// MaxLeaseName is the longest Lease name a Summary holds: a Kubernetes
// object name (a DNS subdomain).
const MaxLeaseName = 253

// Results of a Lease the pod held, in a Summary: the values of
// LeaseResult.Result and the keys of Summary.Unnamed. Leases the pod did
// not hold are not in a Summary.
const (
	ResultReleased = "released" // released: a successor may take it at once
	ResultWithheld = "withheld" // left to expire: the app did not confirm its leader work stopped
	ResultFailed   = "failed"   // not released: the successor waits for the lease duration
)

// Results are the lease results a Summary may carry, in this order.
func Results() []string { return []string{ResultReleased, ResultWithheld, ResultFailed} }

// Summary is one shutdown sequence's outcome, steps and claims.
type Summary struct {
	// V is the format version: Version.
	V int `json:"v"`
	// Outcome is how the drain ended (protocol.Outcomes).
	Outcome protocol.Outcome `json:"outcome"`
	// Trigger is what started the sequence (preStop, SIGTERM, deletion).
	Trigger protocol.Trigger `json:"trigger,omitempty"`
	// Steps are the seconds from the trigger to each step the sequence
	// reached, by protocol.StepName; a step recorded more than once (one
	// per Lease) at its last: when it was done for every Lease.
	Steps map[protocol.StepName]float64 `json:"steps"`
	// Claims are the counts of claims: unstarted at stop-claiming,
	// unfinished (in flight) at the drain deadline, returned by the
	// fallback, and abandoned to the visibility timeout.
	Claims Claims `json:"claims"`
	// Leases are the results of the Leases the pod held, at most
	// MaxLeases, in the sidecar's configured order.
	Leases []LeaseResult `json:"leases,omitempty"`
	// Unnamed counts, by result, the Leases past MaxLeases.
	Unnamed map[string]int `json:"unnamed,omitempty"`
	// Errors is how many steps failed (protocol.Report.Errors).
	Errors int `json:"errors,omitempty"`
}

// Claims are a sequence's claim counts, each 0 or more.
type Claims struct {
	Unstarted  int `json:"unstarted"`  // held, not started, at stop-claiming: handed back at once
	Unfinished int `json:"unfinished"` // in flight at the drain deadline
	Returned   int `json:"returned"`   // handed back by the fallback
	Abandoned  int `json:"abandoned"`  // left to the visibility timeout
}

// LeaseResult is one held Lease's release at shutdown.
type LeaseResult struct {
	Lease  string `json:"lease"`
	Result string `json:"result"` // ResultReleased, ResultWithheld or ResultFailed
	// Hops are the seconds from the trigger (the sequence's start, 0) to
	// each point of the Lease's step 5 that it reached, by Hop; a point not
	// reached is absent. Optional: absent in a summary of a sidecar older
	// than this field.
	Hops map[Hop]float64 `json:"hops,omitempty"`
	// Successor is what the release write named (Successors): absent when
	// no successor was looked for (the setting prefer-successor off, or no
	// release write).
	Successor string `json:"successor,omitempty"`
}

// Hop names a point of one Lease's step 5, in the order a handover passes
// them: the keys of LeaseResult.Hops.
type Hop string

// The points of a Lease's step 5. The revoke and the successor's pick run
// beside each other from the trigger; the release write goes out once the
// app has acknowledged the revoke and the pick is done or given up.
const (
	// HopRevokeSent: the revoke of the app's leadership sent.
	HopRevokeSent Hop = "revoke-sent"
	// HopRevokeAcked: the app acknowledged it (its leader work stopped).
	HopRevokeAcked Hop = "revoke-acked"
	// HopSuccessorPicked: the pick of the pod the release names ended
	// (a successor found or not, or the candidates' list failed).
	HopSuccessorPicked Hop = "successor-picked"
	// HopSuccessorGivenUp: the release stopped waiting for a pick not yet
	// done, and goes out naming no one.
	HopSuccessorGivenUp Hop = "successor-given-up"
	// HopReleaseSent: the release write sent (the last one, after a
	// conflict).
	HopReleaseSent Hop = "release-sent"
	// HopReleaseAcked: the apiserver acknowledged the release write: the
	// Lease is free.
	HopReleaseAcked Hop = "release-acked"
)

// Hops are the hops a Summary may carry, in the order a handover passes
// them.
func Hops() []Hop {
	return []Hop{HopRevokeSent, HopRevokeAcked, HopSuccessorPicked, HopSuccessorGivenUp, HopReleaseSent, HopReleaseAcked}
}

// What a release write named, in LeaseResult.Successor.
const (
	SuccessorNamed  = "named"  // a pod that stays: it takes the Lease first
	SuccessorNone   = "none"   // no other pod up competes for the Lease
	SuccessorLate   = "late"   // the pick was not done when the release went out
	SuccessorFailed = "failed" // the candidates could not be read
)

// Successors are the values of LeaseResult.Successor, in this order.
func Successors() []string {
	return []string{SuccessorNamed, SuccessorNone, SuccessorLate, SuccessorFailed}
}

// FromReport is the Summary of rep; results gives the result of each of
// rep.Leases by index ("" or any other value for a Lease the pod did not
// hold, which is left out). Leases past MaxLeases are counted in Unnamed.
// It carries no hops: WithHops adds them.
func FromReport(rep *protocol.Report, results []string) Summary {
	s := Summary{
		V: Version, Outcome: rep.Outcome, Trigger: rep.Trigger,
		Steps: map[protocol.StepName]float64{},
		Claims: Claims{
			Unstarted: rep.UnstartedAtStopClaiming, Unfinished: rep.InFlightAtDeadline,
			Returned: rep.Returned, Abandoned: rep.Abandoned,
		},
		Errors: len(rep.Errors),
	}
	for _, st := range rep.Steps {
		s.Steps[st.Name] = max(st.At.Sub(rep.Started).Seconds(), 0)
	}
	for i, l := range rep.Leases {
		if i >= len(results) || !slices.Contains(Results(), results[i]) {
			continue
		}
		if len(s.Leases) < MaxLeases && len(l.Lease) <= MaxLeaseName {
			s.Leases = append(s.Leases, LeaseResult{Lease: l.Lease, Result: results[i]})
			continue
		}
		if s.Unnamed == nil {
			s.Unnamed = map[string]int{}
		}
		s.Unnamed[results[i]]++
	}
	return s
}

// LeaseHops are one Lease's times at its hops and what its release named,
// for WithHops.
type LeaseHops struct {
	// At is the time of each hop reached (zero times are left out).
	At map[Hop]time.Time
	// Successor is a value of Successors, or "" for none looked for.
	Successor string
}

// WithHops is s with each named Lease's hops: hops gives them by Lease
// name, each At in seconds from started (clamped at 0), as a hop of the
// trigger's own time is 0; a Lease not in s.Leases (not held, or past
// MaxLeases) gets none.
func (s Summary) WithHops(started time.Time, hops map[string]LeaseHops) Summary {
	leases := slices.Clone(s.Leases)
	for i, l := range leases {
		h, ok := hops[l.Lease]
		if !ok {
			continue
		}
		leases[i].Successor = h.Successor
		for name, at := range h.At {
			if at.IsZero() {
				continue
			}
			if leases[i].Hops == nil {
				leases[i].Hops = map[Hop]float64{}
			}
			leases[i].Hops[name] = max(at.Sub(started).Seconds(), 0)
		}
	}
	s.Leases = leases
	return s
}

// Encode is s as the Annotation's value.
func (s Summary) Encode() string {
	b, err := json.Marshal(s)
	if err != nil { // maps of strings and numbers: cannot fail
		panic(err)
	}
	return string(b)
}

// ErrUnsupportedVersion is Decode's error for a Summary of a version other
// than Version (a newer sidecar's): its reader counts it as unsupported.
var ErrUnsupportedVersion = errors.New("unsupported version")

// Decode reads an Annotation's value. It returns an error wrapping
// ErrUnsupportedVersion for another version, and an error naming the field
// and its accepted form for a value that is not a valid Summary: an
// unknown outcome, step, lease result, hop or successor, a count below 0,
// a step's or a hop's seconds not finite or below 0, more than MaxLeases
// Leases or a Lease name longer than MaxLeaseName.
func Decode(value string) (Summary, error) {
	var s Summary
	if err := json.Unmarshal([]byte(value), &s); err != nil {
		return Summary{}, fmt.Errorf("%s: not a JSON summary: %w", Annotation, err)
	}
	if s.V != Version {
		return Summary{}, fmt.Errorf("%s: v %d: %w (want %d)", Annotation, s.V, ErrUnsupportedVersion, Version)
	}
	var errs []string
	if !slices.Contains(protocol.Outcomes(), s.Outcome) {
		errs = append(errs, fmt.Sprintf("outcome %q: want one of %v", s.Outcome, protocol.Outcomes()))
	}
	for name, sec := range s.Steps {
		if !slices.Contains(protocol.Steps(), name) {
			errs = append(errs, fmt.Sprintf("steps: step %q: want one of %v", name, protocol.Steps()))
		}
		if math.IsNaN(sec) || math.IsInf(sec, 0) || sec < 0 {
			errs = append(errs, fmt.Sprintf("steps.%s: %v: want seconds, 0 or more", name, sec))
		}
	}
	for name, n := range map[string]int{"unstarted": s.Claims.Unstarted, "unfinished": s.Claims.Unfinished,
		"returned": s.Claims.Returned, "abandoned": s.Claims.Abandoned, "errors": s.Errors} {
		if n < 0 {
			errs = append(errs, fmt.Sprintf("%s: %d: want a count, 0 or more", name, n))
		}
	}
	if len(s.Leases) > MaxLeases {
		errs = append(errs, fmt.Sprintf("leases: %d: want at most %d", len(s.Leases), MaxLeases))
	}
	for i, l := range s.Leases {
		if l.Lease == "" || len(l.Lease) > MaxLeaseName {
			errs = append(errs, fmt.Sprintf("leases[%d].lease: %d characters: want 1 to %d", i, len(l.Lease), MaxLeaseName))
		}
		if !slices.Contains(Results(), l.Result) {
			errs = append(errs, fmt.Sprintf("leases[%d].result %q: want one of %v", i, l.Result, Results()))
		}
		for name, sec := range l.Hops {
			if !slices.Contains(Hops(), name) {
				errs = append(errs, fmt.Sprintf("leases[%d].hops: hop %q: want one of %v", i, name, Hops()))
			}
			if math.IsNaN(sec) || math.IsInf(sec, 0) || sec < 0 {
				errs = append(errs, fmt.Sprintf("leases[%d].hops.%s: %v: want seconds, 0 or more", i, name, sec))
			}
		}
		if l.Successor != "" && !slices.Contains(Successors(), l.Successor) {
			errs = append(errs, fmt.Sprintf("leases[%d].successor %q: want one of %v, or none", i, l.Successor, Successors()))
		}
	}
	for r, n := range s.Unnamed {
		if !slices.Contains(Results(), r) || n < 0 {
			errs = append(errs, fmt.Sprintf("unnamed.%s: %d: want a result of %v and a count, 0 or more", r, n, Results()))
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return Summary{}, fmt.Errorf("%s: %s", Annotation, strings.Join(errs, "; "))
	}
	return s, nil
}

// Message is the human-readable message of the Event that carries s for
// the sequence started at started, which took took. The start time, to the
// nanosecond, makes each sequence's message its own, so that client-go's
// Event correlator never folds two sequences into one Event.
func (s Summary) Message(started time.Time, took time.Duration) string {
	released := 0
	for _, l := range s.Leases {
		if l.Result == ResultReleased {
			released++
		}
	}
	released += s.Unnamed[ResultReleased]
	held := len(s.Leases)
	for _, n := range s.Unnamed {
		held += n
	}
	return fmt.Sprintf("Shutdown finished: %s in %s (trigger %s at %s); claims returned %d, abandoned %d; Leases released %d of %d held",
		s.Outcome, took.Round(time.Millisecond), s.Trigger, started.UTC().Format(time.RFC3339Nano), s.Claims.Returned, s.Claims.Abandoned, released, held)
}
