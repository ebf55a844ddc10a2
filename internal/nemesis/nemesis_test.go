package nemesis

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

var params = Params{Window: 3 * time.Minute, Faults: 12, Kinds: Kinds, LeaseDuration: 15 * time.Second}

func TestDrawIsAFunctionOfTheSeed(t *testing.T) {
	a, err := Draw(7, params)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Draw(7, params)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 7 drew two schedules:\n%s\n%s", a, b)
	}
	c, _ := Draw(8, params)
	if reflect.DeepEqual(a.Faults, c.Faults) {
		t.Fatalf("seeds 7 and 8 drew the same schedule:\n%s", a)
	}
	for _, f := range a.Faults {
		if f.At < 0 || f.At > params.Window+2*params.LeaseDuration {
			t.Errorf("%s: starts outside the window", f)
		}
		if f.Kind == SidecarStop && f.Duration <= params.LeaseDuration {
			t.Errorf("%s: a sidecar stop not longer than the lease duration", f)
		}
	}
	if !strings.HasPrefix(a.String(), "seed 7: 12 faults in 3m0s\n") {
		t.Errorf("String() = %q", a.String())
	}
}

func TestDrawOverlapsAndCoversEveryKind(t *testing.T) {
	kinds := map[Kind]bool{}
	overlaps := 0
	for seed := range uint64(30) {
		s, err := Draw(seed, params)
		if err != nil {
			t.Fatal(err)
		}
		overlaps += s.Overlaps()
		for _, f := range s.Faults {
			kinds[f.Kind] = true
		}
	}
	if len(kinds) != len(Kinds) {
		t.Errorf("30 schedules drew %d kinds, want all %d", len(kinds), len(Kinds))
	}
	if overlaps == 0 {
		t.Error("30 schedules of 12 faults: no fault started during another")
	}
}

func TestDrawRejectsBadParams(t *testing.T) {
	for _, p := range []Params{
		{Faults: 1, Kinds: Kinds, LeaseDuration: time.Second},
		{Window: time.Second, Kinds: Kinds, LeaseDuration: time.Second},
		{Window: time.Second, Faults: 1, LeaseDuration: time.Second},
		{Window: time.Second, Faults: 1, Kinds: Kinds},
	} {
		if _, err := Draw(1, p); err == nil {
			t.Errorf("Draw(%+v): no error", p)
		}
	}
}

func TestParseKinds(t *testing.T) {
	ks, err := ParseKinds("etcd-pause, worker-kill")
	if err != nil || !reflect.DeepEqual(ks, []Kind{EtcdPause, WorkerKill}) {
		t.Errorf("ParseKinds = %v, %v", ks, err)
	}
	if ks, _ := ParseKinds("all"); len(ks) != len(Kinds) {
		t.Errorf("ParseKinds(all) = %v", ks)
	}
	if _, err := ParseKinds("etcd-kill"); err == nil || !strings.Contains(err.Error(), `"etcd-kill"`) {
		t.Errorf("ParseKinds(etcd-kill) error = %v, want it to name the kind", err)
	}
}

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

var rules = Rules{LeaseDuration: 15 * time.Second, RetryPeriod: 2 * time.Second, Slack: time.Second,
	KubeletSlack: 5 * time.Second, End: at(300), Leases: []string{"a-leader"}}

// good is a history that keeps every promise: two messages, one applied
// after a redelivery (a duplicate completion), one pending; the Lease moves
// from p1 to p2 at a sidecar kill, p1 stops writing before p2 acquires;
// p1 is deleted and gone within its grace period, stretched by an API
// server pause.
func good() History {
	return History{
		Messages: []Message{{Key: "m1"}, {Key: "m2", Pending: true}},
		Deliveries: []Delivery{
			{Key: "m1", Worker: "p1", Outcome: "claimed", At: at(1)},
			{Key: "m1", Worker: "p2", Outcome: "claimed", At: at(40)},
			{Key: "m1", Worker: "p1", Outcome: "applied", At: at(41)},
			{Key: "m1", Worker: "p2", Outcome: "duplicate", At: at(42)},
			{Key: "m2", Worker: "p2", Outcome: "claimed", At: at(50)},
		},
		Runs: []LeaderRun{
			{Lease: "a-leader", Token: 1, Holder: "p1", At: at(2), Until: at(12)},
			{Lease: "a-leader", Token: 1, Holder: "p1", At: at(9), Until: at(19)},
			{Lease: "a-leader", Token: 2, Holder: "p2", At: at(30), Until: at(40)},
		},
		Leases: []LeaseUpdate{
			{Seen: at(1), Lease: "a-leader", Holder: "p1", Token: 1, Acquired: at(1), Renewed: at(1)},
			{Seen: at(9), Lease: "a-leader", Holder: "p1", Token: 1, Acquired: at(1), Renewed: at(9)},
			{Seen: at(25), Lease: "a-leader", Holder: "p2", Token: 2, Acquired: at(25), Renewed: at(25)},
			{Seen: at(31), Lease: "a-leader", Holder: "p2", Token: 2, Acquired: at(25), Renewed: at(31)},
			{Seen: at(80), Lease: "a-leader", Holder: "p2", Token: 2, Acquired: at(25), Renewed: at(79)},
			{Seen: at(105), Lease: "a-leader", Holder: "p2", Token: 2, Acquired: at(25), Renewed: at(105)},
		},
		Pods: []Pod{
			{Name: "p1", Deleting: at(60), Grace: 15 * time.Second, Gone: at(85)},
		},
		Faults: []Injected{
			{Fault: Fault{Kind: SidecarKill}, Started: at(10), Healed: at(10), Target: "p1"},
			{Fault: Fault{Kind: APIServerPause, Duration: 8 * time.Second}, Started: at(70), Healed: at(78), Target: "kube-apiserver"},
			{Fault: Fault{Kind: EtcdPause, Duration: 4 * time.Second}, Started: at(100), Healed: at(104), Target: "etcd"},
			{Fault: Fault{Kind: WorkerKill}, Started: at(200), Skipped: "no pod"},
		},
	}
}

func TestCheckPassesAGoodHistory(t *testing.T) {
	vs, fig := Check(good(), rules, 3)
	for _, v := range vs {
		t.Error(v)
	}
	want := Figures{Messages: 2, Applied: 1, Pending: 1, Moves: 1, WorstLive: 15 * time.Second, WorstLiveAt: "a-leader after sidecar-kill"}
	if fig != want {
		t.Errorf("figures %+v, want %+v", fig, want)
	}
}

// TestCheckFindsEachViolation breaks each rule in a copy of the good
// history and wants that rule's violation alone, with its slice.
func TestCheckFindsEachViolation(t *testing.T) {
	for _, tc := range []struct {
		name, rule, what string
		breakIt          func(h *History)
		slice            int
		also             string // another rule the change breaks too
	}{
		{"applied twice", RuleExactlyOnce, "message m1 applied 2 times", func(h *History) {
			h.Deliveries[3].Outcome = "applied"
		}, 4, ""},
		{"lost", RuleExactlyOnce, "message m1 lost", func(h *History) {
			h.Deliveries = h.Deliveries[:2]
		}, 2, ""},
		{"applied and pending", RuleExactlyOnce, "message m1 applied and still pending", func(h *History) {
			h.Messages[0].Pending = true
		}, 4, ""},
		{"stale token accepted", RuleFencing, "a write with token 1 accepted after one with token 2", func(h *History) {
			h.Runs = append(h.Runs, LeaderRun{Lease: "a-leader", Token: 1, Holder: "p1", At: at(30.5)})
		}, 2, RuleOverlap},
		{"write after a successor acquired", RuleOverlap, "p1 wrote as leader with token 1 7s after p2 acquired it with token 2", func(h *History) {
			h.Runs[1].At, h.Runs[1].Until = at(32), time.Time{}
			h.Runs[2].At = at(33)
		}, 2, ""},
		{"write after its term", RuleOverlap, "p1 wrote as leader 2.5s after the end of its term", func(h *History) {
			h.Runs[1].At = at(21.5)
		}, 1, ""},
		{"no live holder after a heal", RuleLiveHolder, "no live holder within 18s of the heal at 12:01:44.000", func(h *History) {
			h.Leases[5].Holder = ""
		}, 3, ""},
		{"a live holder too late", RuleLiveHolder, "a live holder only 20s after the heal at 12:00:10.000", func(h *History) {
			h.Leases[2].Seen, h.Leases[2].Acquired, h.Leases[2].Renewed = at(30), at(30), at(30)
		}, 3, ""},
		{"a holder that is gone", RuleLiveHolder, "Lease a-leader: no live holder within 18s of the heal at 12:01:44.000", func(h *History) {
			h.Pods = append(h.Pods, Pod{Name: "p2", Deleting: at(90), Grace: 15 * time.Second, Gone: at(102), Forced: true})
		}, 3, ""},
		{"over its grace period", RuleGrace, "pod p1 gone 34s after its deletion began; bound 28s", func(h *History) {
			h.Pods[0].Gone = at(94)
		}, 3, ""},
		{"never gone", RuleGrace, "pod p1 still there 4m0s after its deletion began", func(h *History) {
			h.Pods[0].Gone = time.Time{}
		}, 3, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := good()
			tc.breakIt(&h)
			vs, _ := Check(h, rules, 42)
			var v Violation
			for _, o := range vs {
				switch o.Rule {
				case tc.rule:
					v = o
				case tc.also:
				default:
					t.Errorf("a violation of another rule: %s", o)
				}
			}
			if v.Rule != tc.rule || !strings.Contains(v.What, tc.what) || len(v.Slice) != tc.slice {
				t.Errorf("got %s", v)
			}
			s := v.String()
			if !strings.Contains(s, "seed 42") || !strings.Contains(s, "sidecar-kill") {
				t.Errorf("the violation does not print the seed and the schedule:\n%s", s)
			}
		})
	}
}

// TestCheckDoesNotHoldAPodToItsGraceUnderANodeAgentRestart: a kubelet or
// containerd restart during a pod's termination, or just before it, takes
// the pod out of the grace-period rule; its time beyond is a figure.
func TestCheckDoesNotHoldAPodToItsGraceUnderANodeAgentRestart(t *testing.T) {
	for _, restart := range []Injected{
		{Fault: Fault{Kind: ContainerdRestart}, Started: at(65), Healed: at(66), Target: "p1 terminating; containerd"},
		{Fault: Fault{Kind: KubeletRestart}, Started: at(57), Healed: at(58), Target: "p0 terminating; kubelet"},
	} {
		h := good()
		h.Pods[0].Gone = at(110)
		h.Faults = append(h.Faults, restart)
		vs, fig := Check(h, rules, 5)
		for _, v := range vs {
			t.Errorf("%s: %s", restart.Kind, v)
		}
		if fig.WorstOverGrace != 35*time.Second || !strings.Contains(fig.WorstOverGraceAt, string(restart.Kind)) {
			t.Errorf("%s: worst over grace %s (%s), want 35s", restart.Kind, fig.WorstOverGrace, fig.WorstOverGraceAt)
		}
	}
	// Healed more than NodeAgentAfter before the deletion: held to it.
	h := good()
	h.Pods[0].Gone = at(110)
	h.Faults = append(h.Faults, Injected{Fault: Fault{Kind: KubeletRestart}, Started: at(50), Healed: at(54)})
	if vs, _ := Check(h, rules, 5); len(vs) != 1 || vs[0].Rule != RuleGrace {
		t.Errorf("a kubelet restart 6s before the deletion: %v, want the grace-period violation", vs)
	}
}

func TestHealsMergesOverlappingFaults(t *testing.T) {
	faults := []Injected{
		{Fault: Fault{Kind: EtcdPause}, Started: at(10), Healed: at(20)},
		{Fault: Fault{Kind: WorkerKill}, Started: at(15), Healed: at(15)},
		{Fault: Fault{Kind: PodAPICut}, Started: at(18), Healed: at(30)},
		{Fault: Fault{Kind: ForceDelete}, Started: at(40), Healed: at(40)},
	}
	ends, of := heals(faults, 0)
	if len(ends) != 2 || !ends[0].Equal(at(30)) || !ends[1].Equal(at(40)) || len(of[0]) != 3 {
		t.Errorf("heals = %v %v", ends, of)
	}
	// A fault within the quiet time of a heal joins its stretch.
	ends, of = heals(faults, 10*time.Second)
	if len(ends) != 1 || !ends[0].Equal(at(40)) || len(of[0]) != 4 {
		t.Errorf("heals with 10s quiet = %v %v", ends, of)
	}
}

// TestCheckLiveHolderWaitsForQuiet: a fault that starts within the bound
// of a heal (a new cut of the holder's network) moves the check to its
// own heal, not the first one.
func TestCheckLiveHolderWaitsForQuiet(t *testing.T) {
	h := good()
	h.Faults = append(h.Faults, Injected{Fault: Fault{Kind: PodAPICut}, Started: at(11), Healed: at(20), Target: "p1"})
	vs, fig := Check(h, rules, 1)
	for _, v := range vs {
		t.Error(v)
	}
	if fig.WorstLive != 5*time.Second || fig.WorstLiveAt != "a-leader after sidecar-kill, pod-api-cut" {
		t.Errorf("worst time to a live holder %s after %s; want 5s after the cut's heal", fig.WorstLive, fig.WorstLiveAt)
	}
}
