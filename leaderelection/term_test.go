package leaderelection

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestTermLength(t *testing.T) {
	for _, tc := range []struct{ leaseDuration, renewDeadline, want time.Duration }{
		{15 * time.Second, 10 * time.Second, 10 * time.Second}, // client-go's defaults: the renew deadline
		{3 * time.Second, 2 * time.Second, 2 * time.Second},
		{2500 * time.Millisecond, 2 * time.Second, time.Second}, // whole seconds less one
		{10900 * time.Millisecond, 10 * time.Second, 9 * time.Second},
	} {
		if got := TermLength(tc.leaseDuration, tc.renewDeadline); got != tc.want {
			t.Errorf("TermLength(%s, %s) = %s, want %s", tc.leaseDuration, tc.renewDeadline, got, tc.want)
		}
	}
}

// The term counts from the earlier of the write's start and the record's
// renew time, on the elector's clock, and Term reports it over once that
// clock reaches Until.
func TestTermRunsOnTheElectorsClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	var got []Term
	e, err := New(Config{Namespace: "ns", Name: "work", Identity: "pod-a_uid-a",
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second, Clock: clk},
		Callbacks{OnTerm: func(tm Term) { got = append(got, tm) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Term(); ok {
		t.Fatal("a term before any write")
	}

	// A renewal stamped 300 ms before its write started counts from the stamp.
	start := clk.Now()
	stamp := start.Add(-300 * time.Millisecond)
	e.wrote(rl.LeaderElectionRecord{HolderIdentity: "pod-a_uid-a", LeaderTransitions: 3, RenewTime: metav1.NewTime(stamp)}, start)
	tm, ok := e.Term()
	if !ok || !tm.Until.Equal(stamp.Add(10*time.Second)) || tm.FencingToken != 3 || tm.Lease != "work" {
		t.Fatalf("Term() = %+v, %t; want until %s, fencing token 3", tm, ok, stamp.Add(10*time.Second))
	}
	if len(got) != 1 || got[0] != tm {
		t.Errorf("OnTerm got %+v, want [%+v]", got, tm)
	}

	clk.Step(tm.Until.Sub(clk.Now()) - time.Nanosecond)
	if _, ok := e.Term(); !ok {
		t.Fatal("term over before Until")
	}
	clk.Step(time.Nanosecond)
	if _, ok := e.Term(); ok {
		t.Fatal("term not over at Until")
	}

	// A record stamped after the write started (a clock ahead of ours)
	// counts from the start: the term never reaches past the local clock.
	start = clk.Now()
	e.wrote(rl.LeaderElectionRecord{HolderIdentity: "pod-a_uid-a", LeaderTransitions: 3, RenewTime: metav1.NewTime(start.Add(time.Second))}, start)
	if tm, _ := e.Term(); !tm.Until.Equal(start.Add(10 * time.Second)) {
		t.Errorf("term until %s, want %s (from the write's start)", tm.Until, start.Add(10*time.Second))
	}
}
