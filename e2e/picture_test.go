package e2e

// This file has no build tag: the picture of the rollout figures and its
// unit test build and run without a cluster (go test ./e2e/ runs only the
// files without the tag, and no TestMain), and are part of the e2e build
// too, where TestRolloutRestart draws the picture.

import (
	"encoding/xml"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/internal/timeline"
)

// replacedPod is what happened to one pod the rollout replaced. Times are
// from its termination start: its deletionTimestamp seen set, which is
// when the kubelet runs the preStop hook (about 0.1 s later) or, with no
// hook, sends SIGTERM.
type replacedPod struct {
	name        string
	terminating time.Time
	gone        time.Duration
	leader      bool          // held the Lease at termination start
	successor   string        // who held the Lease next
	held        time.Duration // until the successor was seen holding the Lease
	free        time.Duration // the Lease seen free before the successor (handoff releases it)
	unfinished  int           // claims neither applied nor duplicate by this pod
	returned    int           // of which handed back by the pod (at stop-claiming or the drain deadline)
	handedBack  int           // of which handed back unstarted, at stop-claiming (queue.OutcomeHandedBack)
	// handedClaimed is until the last of handedBack was claimed by
	// another pod.
	handedClaimed time.Duration
	drainBy       time.Time     // the sidecar's drain deadline (from its DrainStarted Event)
	returnedAt    time.Duration // last hand-back at the drain deadline, from termination start
	claimed       time.Duration // until the last unfinished claim was claimed again by another pod
	lost          int           // messages it claimed that were neither applied nor pending
	duplicates    int           // deliveries of messages it claimed that found them applied already
	hops          handoverHops  // a leader's handover hop by hop (with handoff)
}

// handoverHops is one leader's handover, hop by hop, from the data the
// parts recorded: the test's delete request (or its watch's first sight of
// the deletionTimestamp), the leaving sidecar's shutdown start and release
// (its LeaseReleased Event: "released at T, D after the shutdown
// started"), the hops of its step 5 for the Lease (the leases[].hops of
// its ShutdownFinished Event's summary, internal/outcome: the revoke sent
// and acknowledged, the successor's pick ended or given up, the release
// write sent and acknowledged), the successor's acquiring write (its first
// renewTime on the Lease) and its app told it leads (the successor
// sidecar's log line "app told it leads"). A zero time is a hop not found.
type handoverHops struct {
	termination, started, released, acquired, told time.Time
	// The leaving sidecar's step 5 for the Lease. The revoke and the pick
	// run beside each other from the start; the release write waits for
	// both (for the pick, a bounded time: gaveUp).
	revokeSent, revokeAcked, picked, gaveUp, releaseSent, releaseAcked time.Time
	// successor is what the release named (outcome.Successors).
	successor string
}

// rolloutPicture draws the figures of two rollouts, with handoff and the
// baseline, as a timeline picture: for each, from a pod's termination
// start (+0), the time until the Lease was held by a successor and the time
// until its unfinished claims were all claimed again by other pods, each
// the worst of the rollout's replaced pods (the longest, as the summary's
// rows marked "worst"): of the pods that held the Lease at their
// termination start, and of the pods that left claims unfinished. A run
// with no such pod, or whose leaving leader saw no successor, has no bar
// there, and says so. workload is the caption's line about the run
// (rolloutWorkload).
func rolloutPicture(workload string, with, without []*replacedPod) timeline.Picture {
	return timeline.Picture{
		Title: "A rollout restart: from a pod's termination start (+0) until the work moves on",
		Groups: []timeline.Group{
			{Title: "with handoff", Bars: rolloutBars(with)},
			{Title: "without handoff (baseline)", Bars: rolloutBars(without)},
		},
		Caption: "Per rollout, the worst (longest) of its replaced pods, each from its own termination start " +
			"(its deletionTimestamp seen, about 0.1 s before the kubelet runs the preStop hook or, without handoff, sends SIGTERM). " +
			"Lease: of the pods that held it then, until another pod was seen holding it. " +
			"Claims: of the pods that left claims unfinished, until the last of them was claimed by another pod.\n" +
			workload,
	}
}

// rolloutBars are one rollout's two bars, the Lease held by a successor
// then the unfinished claims claimed again, each its worst pod's.
func rolloutBars(pods []*replacedPod) []timeline.Bar {
	lease := timeline.Bar{Label: "Lease held by a successor", None: "no replaced pod held the Lease"}
	claims := timeline.Bar{Label: "unfinished claims claimed again", None: "no unfinished claims left behind"}
	leaders, orphaned := 0, false
	for _, p := range pods {
		if p.leader {
			leaders++
			lease.Took = max(lease.Took, p.held)
			orphaned = orphaned || p.successor == ""
		}
		if p.unfinished > 0 {
			claims.Took = max(claims.Took, p.claimed)
			claims.None = ""
		}
	}
	switch {
	case orphaned:
		lease.Took, lease.None = 0, "no successor seen holding the Lease after a leader left"
	case leaders > 0:
		lease.None = ""
	}
	return []timeline.Bar{lease, claims}
}

// The rollout picture, from sample figures shaped as a run's: per rollout,
// the worst leader's time to the Lease held by a successor and the worst
// pod's time to its unfinished claims claimed again, or why there is no
// bar; drawn as a well-formed SVG with the caption saying which pod.
func TestRolloutPicture(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	with := []*replacedPod{
		{name: "orders-a", unfinished: 1, returned: 1, claimed: ms(10980)},
		{name: "orders-b", unfinished: 2, returned: 2, claimed: ms(10970)},
		{name: "orders-c", leader: true, successor: "orders-d_1", held: ms(67), free: ms(37)},
	}
	without := []*replacedPod{
		{name: "plain-a", leader: true, successor: "plain-b_1", held: ms(3000)},
		{name: "plain-b", leader: true, successor: "plain-d_1", held: ms(16570), unfinished: 1, claimed: ms(26080)},
		{name: "plain-c"},
	}
	p := rolloutPicture("kubectl rollout restart of 3 replicas; grace period 15s", with, without)
	type bar struct {
		took time.Duration
		none string
	}
	got := func(p timeline.Picture) (bars [][2]bar) {
		for _, g := range p.Groups {
			bars = append(bars, [2]bar{{g.Bars[0].Took, g.Bars[0].None}, {g.Bars[1].Took, g.Bars[1].None}})
		}
		return bars
	}
	if want := [][2]bar{{{took: ms(67)}, {took: ms(10980)}}, {{took: ms(16570)}, {took: ms(26080)}}}; !slices.Equal(got(p), want) {
		t.Errorf("bars (Lease, claims) with handoff and without: %v, want %v (the worst pod's each)", got(p), want)
	}
	if p.Groups[0].Title != "with handoff" || p.Groups[1].Title != "without handoff (baseline)" {
		t.Errorf("groups %q and %q, want with handoff then the baseline", p.Groups[0].Title, p.Groups[1].Title)
	}

	svg := string(p.SVG())
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := dec.Token(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
	}
	for _, want := range []string{"Lease held by a successor +67 ms", "unfinished claims claimed again +11.0 s",
		"Lease held by a successor +16.6 s", "unfinished claims claimed again +26.1 s",
		"the worst (longest) of its replaced pods", "grace period 15s"} {
		if !strings.Contains(svg, want) {
			t.Errorf("no %q in\n%s", want, svg)
		}
	}

	// No leader, no unfinished claims; a leader whose successor was never
	// seen: no bars, and why.
	p = rolloutPicture("", []*replacedPod{{name: "orders-a"}},
		[]*replacedPod{{name: "plain-a", leader: true, held: 0}, {name: "plain-b", leader: true, successor: "plain-c_1", held: ms(900)}})
	if want := [][2]bar{
		{{none: "no replaced pod held the Lease"}, {none: "no unfinished claims left behind"}},
		{{none: "no successor seen holding the Lease after a leader left"}, {none: "no unfinished claims left behind"}},
	}; !slices.Equal(got(p), want) {
		t.Errorf("bars %v, want %v", got(p), want)
	}
	if svg := string(p.SVG()); strings.Contains(svg, "<rect x=") {
		t.Errorf("bars drawn where there are none:\n%s", svg)
	}
}
