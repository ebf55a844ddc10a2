package outcome

import (
	"errors"
	"fmt"
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
	if fmt.Sprint(got.Leases) != "[{a released} {c failed}]" {
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
