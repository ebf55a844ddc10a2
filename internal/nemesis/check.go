package nemesis

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// History is what a run recorded, all of it read from PostgreSQL and from
// watches of the API server, none from the processes' logs. Times are on
// the one clock of the e2e machine (PostgreSQL's, the API server's and the
// watch's, all on the same host).
type History struct {
	// Messages are every message enqueued, by dedup key.
	Messages []Message
	// Deliveries are every claim, completion and hand-back
	// (handoff_deliveries), by the message's dedup key.
	Deliveries []Delivery
	// Runs are every leader write accepted (handoff_leader_runs).
	Runs []LeaderRun
	// Leases are every update of the Leases the watch saw.
	Leases []LeaseUpdate
	// Pods are the lives of the pods the run deleted or saw deleted.
	Pods []Pod
	// Faults are the faults injected, with the times they started and
	// healed.
	Faults []Injected
}

// Message is one message enqueued.
type Message struct {
	Key string
	// Pending: still in the queue at the end of the run.
	Pending bool
}

// Delivery is one row of handoff_deliveries.
type Delivery struct {
	Key     string
	Worker  string
	Outcome string // claimed, applied, duplicate, returned, handed-back
	At      time.Time
}

// LeaderRun is one accepted leader write.
type LeaderRun struct {
	Lease  string
	Token  int64
	Holder string // the pod that wrote it
	At     time.Time
	// Until is the end of the writer's term as it was told ("leader until
	// T"); zero if not recorded.
	Until time.Time
}

// LeaseUpdate is one update of a Lease as the watch saw it.
type LeaseUpdate struct {
	Seen   time.Time // when the watch delivered it
	Lease  string
	Holder string // the holder's pod name, "" when free
	Token  int64  // spec.leaseTransitions
	// Acquired and Renewed are spec.acquireTime and spec.renewTime.
	Acquired, Renewed time.Time
}

// Pod is one pod's deletion as seen.
type Pod struct {
	Name string
	// Deleting is when its deletionTimestamp was first seen, Grace its
	// deletionGracePeriodSeconds then, Gone when its deletion was seen
	// (zero: not gone by the end of the run).
	Deleting time.Time
	Grace    time.Duration
	Gone     time.Time
	// Forced: deleted with grace period 0 by the nemesis.
	Forced bool
}

// Injected is one fault as injected.
type Injected struct {
	Fault
	Started, Healed time.Time
	Target          string // what it hit: a pod, a process, a Deployment
	// Skipped says why the fault was not injected (no target at the
	// time); such a fault has no heal to check.
	Skipped string
}

// Rules are the bounds the checker holds a history to.
type Rules struct {
	// LeaseDuration and RetryPeriod are the sidecars': after a heal every
	// Lease has a live holder within their sum plus Slack.
	LeaseDuration, RetryPeriod time.Duration
	// Slack is allowed on every time bound: the watch's delivery, a
	// commit after its row's timestamp.
	Slack time.Duration
	// KubeletSlack is allowed beyond a pod's grace period for the kubelet's
	// cleanup and the object's deletion.
	KubeletSlack time.Duration
	// End is the end of the run: a heal later than End - (LeaseDuration +
	// RetryPeriod + Slack) is not checked for a live holder.
	End time.Time
	// Leases are the Leases that must have a live holder after each heal.
	Leases []string
}

// Rule names.
const (
	RuleExactlyOnce = "exactly-once"
	RuleFencing     = "fencing"
	RuleOverlap     = "leader-overlap"
	RuleLiveHolder  = "live-holder"
	RuleGrace       = "grace-period"
)

// Violation is one broken rule with the smallest slice of the history that
// shows it.
type Violation struct {
	Rule   string
	What   string
	Slice  []string
	Seed   uint64
	Faults []Injected
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "VIOLATION %s (seed %d): %s\n", v.Rule, v.Seed, v.What)
	b.WriteString("  history:\n")
	for _, l := range v.Slice {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	b.WriteString("  schedule:\n")
	for _, f := range v.Faults {
		fmt.Fprintf(&b, "    %s\n", f)
	}
	return b.String()
}

func (f Injected) String() string {
	if f.Skipped != "" {
		return fmt.Sprintf("%s (skipped: %s)", f.Fault, f.Skipped)
	}
	return fmt.Sprintf("%s on %s: %s to %s", f.Fault, f.Target, clock(f.Started), clock(f.Healed))
}

func clock(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format("15:04:05.000")
}

// Figures are what the checker measured beside the rules.
type Figures struct {
	Messages, Applied, Pending int
	// Moves counts the changes of a Lease's holder from one pod to
	// another, over every Lease.
	Moves int
	// WorstLive is the longest time from a heal to every Lease having a
	// live holder, and WorstLiveAt the fault of that heal.
	WorstLive   time.Duration
	WorstLiveAt string
	// WorstOverGrace is the longest time beyond its grace period that a
	// pod took to go while the kubelet or containerd restarted under its
	// termination (not promised: see checkGrace), and WorstOverGraceAt
	// the pod and the fault.
	WorstOverGrace   time.Duration
	WorstOverGraceAt string
}

// Check decides from h alone whether the run kept its promises:
//
//   - exactly-once: every message was applied once, or is still pending and
//     was applied never;
//   - fencing: no leader write was accepted with a fencing token lower than
//     one already accepted for its Lease;
//   - leader-overlap: no pod wrote as leader after another pod had acquired
//     the Lease with a higher token (Acquired + Slack), nor after the end
//     of the term it was told (Until + Slack);
//   - live-holder: after each heal of a fault (the end of each stretch in
//     which some fault was active, a fault starting within the bound of
//     a stretch's end joining it), every Lease of rules.Leases was renewed
//     by a holder whose pod was not gone within the bound, LeaseDuration +
//     RetryPeriod + Slack;
//   - grace-period: every pod deleted gracefully was gone within its grace
//     period + KubeletSlack, plus the time within it that the control plane
//     was down (the object cannot be deleted then); a pod whose
//     termination a kubelet or containerd restart overlapped, or preceded
//     by less than NodeAgentAfter, is not held to it (Figures.WorstOverGrace).
//
// It returns the violations, each with its slice of the history, and the
// figures.
func Check(h History, rules Rules, seed uint64) ([]Violation, Figures) {
	var vs []Violation
	add := func(rule, what string, slice []string) {
		vs = append(vs, Violation{Rule: rule, What: what, Slice: slice, Seed: seed, Faults: h.Faults})
	}
	var fig Figures
	checkExactlyOnce(h, &fig, add)
	checkFencing(h, add)
	checkOverlap(h, rules, add)
	checkLive(h, rules, &fig, add)
	checkGrace(h, rules, &fig, add)
	fig.Moves = moves(h.Leases)
	return vs, fig
}

func checkExactlyOnce(h History, fig *Figures, add func(string, string, []string)) {
	byKey := map[string][]Delivery{}
	for _, d := range h.Deliveries {
		byKey[d.Key] = append(byKey[d.Key], d)
	}
	fig.Messages = len(h.Messages)
	for _, m := range h.Messages {
		ds := byKey[m.Key]
		applied := 0
		for _, d := range ds {
			if d.Outcome == "applied" {
				applied++
			}
		}
		if applied == 1 {
			fig.Applied++
		}
		if m.Pending {
			fig.Pending++
		}
		var what string
		switch {
		case applied > 1:
			what = fmt.Sprintf("message %s applied %d times", m.Key, applied)
		case applied == 1 && m.Pending:
			what = fmt.Sprintf("message %s applied and still pending", m.Key)
		case applied == 0 && !m.Pending:
			what = fmt.Sprintf("message %s lost: never applied and not pending", m.Key)
		default:
			continue
		}
		var slice []string
		for _, d := range ds {
			slice = append(slice, fmt.Sprintf("%s delivery of %s: %s by %s", clock(d.At), d.Key, d.Outcome, d.Worker))
		}
		add(RuleExactlyOnce, what, slice)
	}
}

// runsByLease returns h's runs grouped by Lease, each in order of time.
func runsByLease(runs []LeaderRun) map[string][]LeaderRun {
	by := map[string][]LeaderRun{}
	for _, r := range runs {
		by[r.Lease] = append(by[r.Lease], r)
	}
	for _, rs := range by {
		slices.SortStableFunc(rs, func(a, b LeaderRun) int { return a.At.Compare(b.At) })
	}
	return by
}

func (r LeaderRun) String() string {
	s := fmt.Sprintf("%s leader write on %s by %s, token %d", clock(r.At), r.Lease, r.Holder, r.Token)
	if !r.Until.IsZero() {
		s += ", until " + clock(r.Until)
	}
	return s
}

func (u LeaseUpdate) String() string {
	holder := u.Holder
	if holder == "" {
		holder = "(free)"
	}
	return fmt.Sprintf("%s Lease %s: holder %s, transitions %d, acquired %s, renewed %s", clock(u.Seen), u.Lease, holder, u.Token, clock(u.Acquired), clock(u.Renewed))
}

func checkFencing(h History, add func(string, string, []string)) {
	for lease, rs := range runsByLease(h.Runs) {
		best := -1
		for i, r := range rs {
			if best >= 0 && r.Token < rs[best].Token {
				add(RuleFencing, fmt.Sprintf("Lease %s: a write with token %d accepted after one with token %d", lease, r.Token, rs[best].Token),
					[]string{rs[best].String(), r.String()})
			}
			if best < 0 || r.Token >= rs[best].Token {
				best = i
			}
		}
	}
}

func checkOverlap(h History, rules Rules, add func(string, string, []string)) {
	// The first acquisition seen of each (Lease, token) by a holder.
	type acq struct {
		u LeaseUpdate
	}
	acquired := map[string][]acq{}
	seen := map[string]bool{}
	for _, u := range h.Leases {
		k := fmt.Sprintf("%s/%d", u.Lease, u.Token)
		if u.Holder == "" || seen[k] {
			continue
		}
		seen[k] = true
		acquired[u.Lease] = append(acquired[u.Lease], acq{u})
	}
	for _, r := range h.Runs {
		if !r.Until.IsZero() && r.At.After(r.Until.Add(rules.Slack)) {
			add(RuleOverlap, fmt.Sprintf("Lease %s: %s wrote as leader %s after the end of its term", r.Lease, r.Holder, r.At.Sub(r.Until)),
				[]string{r.String()})
		}
		for _, a := range acquired[r.Lease] {
			if a.u.Token > r.Token && a.u.Holder != r.Holder && r.At.After(a.u.Acquired.Add(rules.Slack)) {
				add(RuleOverlap, fmt.Sprintf("Lease %s: %s wrote as leader with token %d %s after %s acquired it with token %d",
					r.Lease, r.Holder, r.Token, r.At.Sub(a.u.Acquired), a.u.Holder, a.u.Token),
					[]string{a.u.String(), r.String()})
				break
			}
		}
	}
}

// heals are the ends of the stretches in which some injected fault was
// active, each with the faults of its stretch. A fault that starts within
// quiet of a stretch's end joins it: the promise after a heal is for the
// time the cluster is left alone.
func heals(faults []Injected, quiet time.Duration) (ends []time.Time, of [][]Injected) {
	fs := slices.DeleteFunc(slices.Clone(faults), func(f Injected) bool { return f.Skipped != "" || f.Started.IsZero() })
	slices.SortStableFunc(fs, func(a, b Injected) int { return a.Started.Compare(b.Started) })
	var end time.Time
	var cur []Injected
	for i, f := range fs {
		if i > 0 && f.Started.After(end.Add(quiet)) {
			ends, of = append(ends, end), append(of, cur)
			cur = nil
		}
		cur = append(cur, f)
		if f.Healed.After(end) {
			end = f.Healed
		}
	}
	if len(cur) > 0 {
		ends, of = append(ends, end), append(of, cur)
	}
	return ends, of
}

func checkLive(h History, rules Rules, fig *Figures, add func(string, string, []string)) {
	bound := rules.LeaseDuration + rules.RetryPeriod + rules.Slack
	gone := map[string]time.Time{}
	for _, p := range h.Pods {
		if !p.Gone.IsZero() {
			gone[p.Name] = p.Gone
		}
	}
	ends, of := heals(h.Faults, bound)
	for i, healed := range ends {
		if !rules.End.IsZero() && healed.Add(bound).After(rules.End) {
			continue
		}
		for _, lease := range rules.Leases {
			var live time.Time
			var before *LeaseUpdate
			for _, u := range h.Leases {
				if u.Lease != lease {
					continue
				}
				if u.Seen.Before(healed) {
					before = &u
					continue
				}
				g, isGone := gone[u.Holder]
				if u.Holder != "" && !u.Renewed.Before(healed) && (!isGone || g.After(u.Seen)) {
					live = u.Seen
					break
				}
			}
			names := make([]string, len(of[i]))
			for j, f := range of[i] {
				names[j] = string(f.Kind)
			}
			took := live.Sub(healed)
			if live.IsZero() || took > bound {
				slice := []string{fmt.Sprintf("%s healed: %s", clock(healed), strings.Join(names, ", "))}
				if before != nil {
					slice = append(slice, "last before: "+before.String())
				}
				limit := maxTime(healed.Add(bound), live)
				for _, u := range h.Leases {
					if u.Lease == lease && !u.Seen.Before(healed) && !u.Seen.After(limit) {
						slice = append(slice, u.String())
					}
				}
				what := fmt.Sprintf("Lease %s: no live holder within %s of the heal at %s", lease, bound, clock(healed))
				if !live.IsZero() {
					what = fmt.Sprintf("Lease %s: a live holder only %s after the heal at %s (bound %s)", lease, took, clock(healed), bound)
				}
				add(RuleLiveHolder, what, slice)
			}
			if !live.IsZero() && took > fig.WorstLive {
				fig.WorstLive, fig.WorstLiveAt = took, fmt.Sprintf("%s after %s", lease, strings.Join(names, ", "))
			}
		}
	}
}

// excused are the faults during which the object of a terminating pod
// cannot be deleted: the control plane down.
func excused(k Kind) bool {
	switch k {
	case APIServerPause, APIServerRestart, EtcdPause:
		return true
	}
	return false
}

// NodeAgentAfter is how long after a kubelet or containerd restart a
// pod's termination is still not held to its grace period: the runs on
// the e2e machine saw pods whose termination began up to 1.4 s after a
// containerd restart use their whole grace period and 5.5 s more.
const NodeAgentAfter = 5 * time.Second

// nodeAgentRestart reports whether a kubelet or containerd restart (of
// faults) was under way during [from, to], or healed less than
// NodeAgentAfter before from.
func nodeAgentRestart(faults []Injected, from, to time.Time) (Injected, bool) {
	for _, f := range faults {
		if f.Skipped != "" || (f.Kind != KubeletRestart && f.Kind != ContainerdRestart) {
			continue
		}
		if !f.Started.After(to) && !f.Healed.Add(NodeAgentAfter).Before(from) {
			return f, true
		}
	}
	return Injected{}, false
}

func checkGrace(h History, rules Rules, fig *Figures, add func(string, string, []string)) {
	for _, p := range h.Pods {
		if p.Forced || p.Deleting.IsZero() {
			continue
		}
		// Not promised: the node agent that deletes the pod restarted
		// under its termination. Its time is a figure, not a violation.
		if f, ok := nodeAgentRestart(h.Faults, p.Deleting, p.Deleting.Add(p.Grace)); ok {
			end := p.Gone
			if end.IsZero() {
				end = rules.End
			}
			if over := end.Sub(p.Deleting) - p.Grace; over > fig.WorstOverGrace {
				fig.WorstOverGrace, fig.WorstOverGraceAt = over, fmt.Sprintf("pod %s, grace period %s, after %s", p.Name, p.Grace, f)
			}
			continue
		}
		deadline := p.Deleting.Add(p.Grace + rules.KubeletSlack)
		// Extend by the faults' overlap with [Deleting, deadline], in order
		// of start, so that an extension can take in a later fault.
		fs := slices.Clone(h.Faults)
		slices.SortStableFunc(fs, func(a, b Injected) int { return a.Started.Compare(b.Started) })
		var excuses []string
		cover := p.Deleting
		for _, f := range fs {
			if f.Skipped != "" || !excused(f.Kind) || f.Started.After(deadline) {
				continue
			}
			healed := f.Healed
			if healed.IsZero() {
				healed = f.Started
			}
			from := maxTime(f.Started, cover)
			if healed.After(from) {
				deadline = deadline.Add(healed.Sub(from))
				cover = healed
				excuses = append(excuses, f.String())
			}
		}
		end := p.Gone
		if end.IsZero() {
			end = rules.End
		}
		if end.IsZero() || !end.After(deadline) {
			continue
		}
		state := "gone " + end.Sub(p.Deleting).Round(time.Millisecond).String() + " after"
		if p.Gone.IsZero() {
			state = "still there " + end.Sub(p.Deleting).Round(time.Millisecond).String() + " after"
		}
		slice := []string{fmt.Sprintf("%s pod %s deleting, grace period %s", clock(p.Deleting), p.Name, p.Grace),
			fmt.Sprintf("%s pod %s gone", clock(p.Gone), p.Name)}
		for _, e := range excuses {
			slice = append(slice, "excused: "+e)
		}
		add(RuleGrace, fmt.Sprintf("pod %s %s its deletion began; bound %s", p.Name, state, deadline.Sub(p.Deleting).Round(time.Millisecond)), slice)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// moves counts the changes of holder from one pod to another, per Lease.
func moves(us []LeaseUpdate) int {
	last := map[string]string{}
	n := 0
	for _, u := range us {
		if u.Holder == "" {
			continue
		}
		if prev, ok := last[u.Lease]; ok && prev != u.Holder {
			n++
		}
		last[u.Lease] = u.Holder
	}
	return n
}

// SortLeases orders Lease updates by the time they were seen.
func SortLeases(us []LeaseUpdate) {
	slices.SortStableFunc(us, func(a, b LeaseUpdate) int { return cmp.Compare(a.Seen.UnixNano(), b.Seen.UnixNano()) })
}
