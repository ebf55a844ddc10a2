// Package nemesis draws fault schedules from a seed and checks a recorded
// history of a run under them, for the e2e nemesis (e2e/nemesis_test.go,
// e2e/nemesis.sh). It has no cluster in it: the schedule is a pure function
// of its seed and the checker a pure function of the history, so both are
// unit-tested on their own and a violation can be replayed from its seed.
package nemesis

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kind is a kind of fault.
type Kind string

// The kinds of fault. Each one has a heal: the moment the fault is undone
// (the process continued or back, the network restored) or, for a fault
// with nothing to undo (a kill, a force-delete), the moment it was done.
const (
	APIServerPause    Kind = "apiserver-pause"    // SIGSTOP kube-apiserver, SIGCONT after Duration
	APIServerRestart  Kind = "apiserver-restart"  // SIGKILL kube-apiserver; up.sh's supervisor starts it again
	EtcdPause         Kind = "etcd-pause"         // SIGSTOP etcd, SIGCONT after Duration
	PodAPICut         Kind = "pod-api-cut"        // the Lease holder's network to the API server cut for Duration
	PodNetCut         Kind = "pod-net-cut"        // the Lease holder's network cut completely for Duration
	SidecarKill       Kind = "sidecar-kill"       // SIGKILL the Lease holder's sidecar
	SidecarStop       Kind = "sidecar-stop"       // SIGSTOP the Lease holder's sidecar for Duration (longer than the lease duration)
	WorkerKill        Kind = "worker-kill"        // SIGKILL a pod's worker
	PreStopKill       Kind = "prestop-kill"       // SIGKILL the preStop hook's process of a terminating pod
	KubeletRestart    Kind = "kubelet-restart"    // restart the kubelet while a pod terminates
	ContainerdRestart Kind = "containerd-restart" // restart containerd while a pod terminates
	ForceDelete       Kind = "force-delete"       // delete a pod with grace period 0
	NodeDrain         Kind = "node-drain"         // evict a Deployment's pods during a rollout
)

// Kinds are every kind of fault, in a fixed order (a schedule's draw
// depends on it).
var Kinds = []Kind{APIServerPause, APIServerRestart, EtcdPause, PodAPICut, PodNetCut, SidecarKill, SidecarStop,
	WorkerKill, PreStopKill, KubeletRestart, ContainerdRestart, ForceDelete, NodeDrain}

// ParseKinds parses a comma-separated list of kinds; "" or "all" is every
// kind.
func ParseKinds(s string) ([]Kind, error) {
	if s == "" || s == "all" {
		return slices.Clone(Kinds), nil
	}
	var ks []Kind
	for f := range strings.SplitSeq(s, ",") {
		k := Kind(strings.TrimSpace(f))
		if !slices.Contains(Kinds, k) {
			return nil, fmt.Errorf("fault kind %q: want a comma-separated list of %v, or all", k, Kinds)
		}
		ks = append(ks, k)
	}
	return ks, nil
}

// Fault is one fault of a schedule.
type Fault struct {
	// At is when it starts, from the start of the schedule's window.
	At   time.Duration
	Kind Kind
	// Duration is how long it lasts before its heal; 0 for a fault with
	// nothing to undo.
	Duration time.Duration
	// Target picks the fault's target among the candidates when it starts
	// (a Deployment, a pod): candidate Target % len(candidates).
	Target int
}

// End is when the fault heals, from the start of the window.
func (f Fault) End() time.Duration { return f.At + f.Duration }

func (f Fault) String() string {
	s := fmt.Sprintf("+%s %s target %d", f.At.Round(10*time.Millisecond), f.Kind, f.Target)
	if f.Duration > 0 {
		s += fmt.Sprintf(" for %s", f.Duration.Round(10*time.Millisecond))
	}
	return s
}

// Schedule is the faults drawn from one seed, ordered by start.
type Schedule struct {
	Seed   uint64
	Window time.Duration
	Faults []Fault
}

// Params shape a schedule.
type Params struct {
	// Window is the stretch of time in which faults start (> 0).
	Window time.Duration
	// Faults is how many faults to draw (≥ 1).
	Faults int
	// Kinds are the kinds to draw from (≥ 1).
	Kinds []Kind
	// LeaseDuration: SidecarStop lasts longer than it.
	LeaseDuration time.Duration
}

// Draw draws a schedule from seed: the same seed and params give the same
// schedule (math/rand/v2's PCG, seeded with seed and a fixed stream). The
// faults start at random moments in the window, so some overlap; one in
// three is placed inside an earlier fault, so overlaps are certain to occur
// in a schedule of several.
func Draw(seed uint64, p Params) (Schedule, error) {
	switch {
	case p.Window <= 0:
		return Schedule{}, fmt.Errorf("nemesis: window %s: want > 0", p.Window)
	case p.Faults < 1:
		return Schedule{}, fmt.Errorf("nemesis: %d faults: want 1 or more", p.Faults)
	case len(p.Kinds) == 0:
		return Schedule{}, fmt.Errorf("nemesis: no fault kinds to draw from")
	case p.LeaseDuration <= 0:
		return Schedule{}, fmt.Errorf("nemesis: lease duration %s: want > 0", p.LeaseDuration)
	}
	r := rand.New(rand.NewPCG(seed, 0x6e656d65736973)) // "nemesis"
	s := Schedule{Seed: seed, Window: p.Window}
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo)+1)) }
	for i := range p.Faults {
		f := Fault{Kind: p.Kinds[r.IntN(len(p.Kinds))], Target: r.IntN(1 << 16)}
		f.At = time.Duration(r.Int64N(int64(p.Window)))
		if i > 0 && r.IntN(3) == 0 { // inside an earlier fault
			e := s.Faults[r.IntN(i)]
			f.At = e.At + time.Duration(r.Int64N(int64(max(e.Duration, time.Second))))
		}
		switch f.Kind {
		case APIServerPause, EtcdPause:
			f.Duration = between(2*time.Second, 12*time.Second)
		case PodAPICut, PodNetCut:
			f.Duration = between(3*time.Second, 2*p.LeaseDuration)
		case SidecarStop:
			f.Duration = between(p.LeaseDuration+time.Second, 2*p.LeaseDuration)
		}
		s.Faults = append(s.Faults, f)
	}
	slices.SortStableFunc(s.Faults, func(a, b Fault) int { return int(a.At - b.At) })
	return s, nil
}

func (s Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d faults in %s\n", s.Seed, len(s.Faults), s.Window)
	for _, f := range s.Faults {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	return b.String()
}

// Overlaps counts the faults that start while an earlier one is not healed.
func (s Schedule) Overlaps() int {
	n := 0
	var end time.Duration
	for i, f := range s.Faults {
		if i > 0 && f.At < end {
			n++
		}
		end = max(end, f.End())
	}
	return n
}
