package outcome

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

func TestFromReportRoundTrips(t *testing.T) {
	start := time.Date(2026, 12, 7, 12, 0, 0, 123456789, time.UTC)
	rep := &protocol.Report{
		Trigger: protocol.TriggerPreStop, Started: start, Outcome: protocol.OutcomeReturned,
		UnstartedAtStopClaiming: 2, InFlightAtDeadline: 3, Returned: 3,
		Steps: []protocol.Step{
			{Name: protocol.StepStopClaiming, At: start.Add(5 * time.Millisecond)},
			{Name: protocol.StepReleased, At: start.Add(10 * time.Millisecond)},
			{Name: protocol.StepReleased, At: start.Add(30 * time.Millisecond)},
			{Name: protocol.StepDone, At: start.Add(40 * time.Millisecond)},
		},
		Leases: []protocol.LeaseRelease{{Lease: "a"}, {Lease: "b"}, {Lease: "c"}},
		Errors: []string{"releasing Lease c: boom"},
	}
	s := FromReport(rep, []string{ResultReleased, "not_leader", ResultFailed})
	got, err := Decode(s.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.Outcome != protocol.OutcomeReturned || got.Claims != (Claims{Unstarted: 2, Unfinished: 3, Returned: 3}) || got.Errors != 1 {
		t.Errorf("decoded %+v", got)
	}
	if got.Steps[protocol.StepReleased] != 0.03 || got.Steps[protocol.StepDone] != 0.04 || len(got.Steps) != 3 {
		t.Errorf("steps %v: want each at its last, in seconds", got.Steps)
	}
	var leases []string
	for _, l := range got.Leases {
		leases = append(leases, l.Lease+" "+l.Result)
	}
	if strings.Join(leases, ", ") != "a released, c failed" {
		t.Errorf("leases %v: want the held ones with their results", got.Leases)
	}
	msg := s.Message(start, 40*time.Millisecond)
	if !strings.Contains(msg, "Returned in 40ms") || !strings.Contains(msg, "2026-12-07T12:00:00.123456789Z") || !strings.Contains(msg, "released 1 of 2 held") {
		t.Errorf("message %q", msg)
	}
}

func TestFromReportBoundsLeases(t *testing.T) {
	rep := &protocol.Report{Outcome: protocol.OutcomeDrained}
	var results []string
	for i := range MaxLeases + 5 {
		rep.Leases = append(rep.Leases, protocol.LeaseRelease{Lease: fmt.Sprintf("shard-%d", i)})
		results = append(results, ResultReleased)
	}
	rep.Leases = append(rep.Leases, protocol.LeaseRelease{Lease: strings.Repeat("x", MaxLeaseName+1)})
	results = append(results, ResultFailed)
	s, err := Decode(FromReport(rep, results).Encode())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Leases) != MaxLeases || s.Unnamed[ResultReleased] != 5 || s.Unnamed[ResultFailed] != 1 {
		t.Errorf("%d named, unnamed %v: want %d named, 5 released and 1 failed unnamed", len(s.Leases), s.Unnamed, MaxLeases)
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, c := range []struct{ value, want string }{
		{`nope`, "not a JSON summary"},
		{`{"v":2,"outcome":"Drained"}`, "unsupported version"},
		{`{"v":1,"outcome":"Fine"}`, `outcome "Fine": want one of`},
		{`{"v":1,"outcome":"Drained","steps":{"nap":1}}`, `step "nap"`},
		{`{"v":1,"outcome":"Drained","steps":{"done":-1}}`, "steps.done: -1: want seconds"},
		{`{"v":1,"outcome":"Drained","claims":{"returned":-2}}`, "returned: -2: want a count"},
		{`{"v":1,"outcome":"Drained","leases":[{"lease":"a","result":"kept"}]}`, `leases[0].result "kept"`},
		{`{"v":1,"outcome":"Drained","leases":[{"lease":"","result":"released"}]}`, "leases[0].lease: 0 characters"},
		{`{"v":1,"outcome":"Drained","unnamed":{"lost":1}}`, "unnamed.lost"},
		{`{"v":1,"outcome":"Drained","leases":[{"lease":"a","result":"released","hops":{"nap":0.1}}]}`, `leases[0].hops: hop "nap"`},
		{`{"v":1,"outcome":"Drained","leases":[{"lease":"a","result":"released","hops":{"release-sent":-0.5}}]}`, "leases[0].hops.release-sent: -0.5: want seconds"},
		{`{"v":1,"outcome":"Drained","leases":[{"lease":"a","result":"released","successor":"maybe"}]}`, `leases[0].successor "maybe"`},
	} {
		_, err := Decode(c.value)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), Annotation) {
			t.Errorf("Decode(%s) = %v, want an error naming %s and %q", c.value, err, Annotation, c.want)
		}
	}
	_, err := Decode(`{"v":7}`)
	if !errors.Is(err, ErrUnsupportedVersion) {
		t.Errorf("Decode of v7: %v, want ErrUnsupportedVersion", err)
	}
	var many strings.Builder
	many.WriteString(`{"v":1,"outcome":"Drained","leases":[`)
	for i := range MaxLeases + 1 {
		if i > 0 {
			many.WriteString(",")
		}
		fmt.Fprintf(&many, `{"lease":"l%d","result":"released"}`, i)
	}
	many.WriteString("]}")
	if _, err := Decode(many.String()); err == nil || !strings.Contains(err.Error(), "want at most 64") {
		t.Errorf("Decode of %d leases: %v", MaxLeases+1, err)
	}
}

// Each held Lease's hops, in seconds from the trigger, and what its release
// named round-trip; a Lease not held gets none, and a hop before the start
// counts as 0.
func TestWithHopsRoundTrips(t *testing.T) {
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	ms := func(n float64) time.Time { return start.Add(time.Duration(n * float64(time.Millisecond))) }
	rep := &protocol.Report{Outcome: protocol.OutcomeDrained, Started: start,
		Leases: []protocol.LeaseRelease{{Lease: "work"}, {Lease: "cron"}, {Lease: "idle"}}}
	base := FromReport(rep, []string{ResultReleased, ResultReleased, "not_leader"})
	s := base.WithHops(start, map[string]LeaseHops{
		"work": {Successor: SuccessorNamed, At: map[Hop]time.Time{HopRevokeSent: ms(0.25), HopRevokeAcked: ms(2), HopSuccessorPicked: ms(4.5),
			HopReleaseSent: ms(4.75), HopReleaseAcked: ms(9)}},
		"cron": {Successor: SuccessorLate, At: map[Hop]time.Time{HopRevokeSent: start.Add(-time.Millisecond), HopSuccessorGivenUp: ms(250), HopReleaseSent: {}}},
		"idle": {Successor: SuccessorNone, At: map[Hop]time.Time{HopRevokeSent: ms(1)}},
	})
	got, err := Decode(s.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Leases) != 2 {
		t.Fatalf("leases %v, want work and cron", got.Leases)
	}
	work, cron := got.Leases[0], got.Leases[1]
	want := map[Hop]float64{HopRevokeSent: 0.00025, HopRevokeAcked: 0.002, HopSuccessorPicked: 0.0045, HopReleaseSent: 0.00475, HopReleaseAcked: 0.009}
	if work.Successor != SuccessorNamed || len(work.Hops) != len(want) {
		t.Errorf("work: %+v, want successor named and hops %v", work, want)
	}
	for h, sec := range want {
		if math.Abs(work.Hops[h]-sec) > 1e-9 {
			t.Errorf("work's %s at %v s, want %v", h, work.Hops[h], sec)
		}
	}
	if cron.Successor != SuccessorLate || len(cron.Hops) != 2 || cron.Hops[HopRevokeSent] != 0 || cron.Hops[HopSuccessorGivenUp] != 0.25 {
		t.Errorf("cron: %+v, want successor late, revoke-sent 0 (clamped), given up at 0.25 and no zero time", cron)
	}
	if base.Leases[0].Hops != nil || base.Leases[0].Successor != "" {
		t.Errorf("FromReport gave hops, or WithHops changed the summary it was called on: %+v", base.Leases[0])
	}
}

// The hops and the successor are optional within version 1: a summary
// without them (an earlier sidecar's) decodes, and one with them decodes
// in the shape of an earlier reader, which drops them.
func TestHopsAreOptionalInVersion1(t *testing.T) {
	s, err := Decode(`{"v":1,"outcome":"Drained","steps":{},"claims":{"unstarted":0,"unfinished":0,"returned":0,"abandoned":0},"leases":[{"lease":"a","result":"released"}]}`)
	if err != nil || s.Leases[0].Hops != nil || s.Leases[0].Successor != "" {
		t.Errorf("a summary without hops: %+v, %v", s, err)
	}
	var earlier struct {
		V      int `json:"v"`
		Leases []struct {
			Lease  string `json:"lease"`
			Result string `json:"result"`
		} `json:"leases"`
	}
	withHops := Summary{V: Version, Outcome: protocol.OutcomeDrained, Leases: []LeaseResult{{Lease: "a", Result: ResultReleased,
		Hops: map[Hop]float64{HopReleaseAcked: 0.01}, Successor: SuccessorNone}}}.Encode()
	if err := json.Unmarshal([]byte(withHops), &earlier); err != nil || earlier.V != Version || earlier.Leases[0].Result != ResultReleased {
		t.Errorf("an earlier reader of %s: %+v, %v", withHops, earlier, err)
	}
}
