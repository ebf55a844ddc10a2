package main

import (
	"fmt"
	"time"

	"github.com/handoff-dev/handoff/bench/internal/stats"
	"github.com/handoff-dev/handoff/leaderelection"
)

// handover is one measured handover: when the holder was stopped (its
// context cancelled, the trigger), when the bench's Leases client saw its
// release write acknowledged, when the standby started leading (OnTerm),
// and, for handoff, the time of each hop as the elector traced it (zero
// for client-go, which has no trace).
type handover struct {
	trigger, released, led time.Time
	hop                    [leaderelection.HopAcquireAcked + 1]time.Time
}

// total is release acknowledged -> standby leading, the figure printed
// since the first bench/takeover.
func (h handover) total() time.Duration { return h.led.Sub(h.released) }

// segment is one hop of the path: from one point to the next.
type segment struct {
	name     string
	from, to func(handover) time.Time
}

func at(p leaderelection.Hop) func(handover) time.Time {
	return func(h handover) time.Time { return h.hop[p] }
}

var segments = []segment{
	{"trigger -> release write sent", func(h handover) time.Time { return h.trigger }, at(leaderelection.HopReleaseSent)},
	{"release write sent -> acknowledged", at(leaderelection.HopReleaseSent), at(leaderelection.HopReleaseAcked)},
	{"release acknowledged -> standby's watch sees it free", at(leaderelection.HopReleaseAcked), at(leaderelection.HopFreeSeen)},
	{"watch sees it -> standby's elector handed it", at(leaderelection.HopFreeSeen), at(leaderelection.HopFreeAnswered)},
	{"elector handed it -> acquire write sent", at(leaderelection.HopFreeAnswered), at(leaderelection.HopAcquireSent)},
	{"acquire write sent -> acknowledged", at(leaderelection.HopAcquireSent), at(leaderelection.HopAcquireAcked)},
	{"acquire acknowledged -> OnTerm (leading)", at(leaderelection.HopAcquireAcked), func(h handover) time.Time { return h.led }},
}

// printHops prints handoff's handovers hop by hop, the total over the same
// traced points, and the floor measured in the same run.
func printHops(hs []handover, fl floor) {
	fmt.Printf("\n  handoff, hop by hop (the standby's watch event may come before the release's answer: a hop can be negative)\n")
	for _, s := range segments {
		var d []time.Duration
		for _, h := range hs {
			from, to := s.from(h), s.to(h)
			if from.IsZero() || to.IsZero() {
				continue
			}
			d = append(d, to.Sub(from))
		}
		fmt.Printf("    %-54s %s\n", s.name, stats.Summary(d))
	}
	var traced []time.Duration
	for _, h := range hs {
		if a, l := h.hop[leaderelection.HopReleaseAcked], h.led; !a.IsZero() {
			traced = append(traced, l.Sub(a))
		}
	}
	fmt.Printf("    %-54s %s\n", "total, release acknowledged -> leading (traced)", stats.Summary(traced))
	fmt.Printf("\n  Floor, same apiserver, same run (%d probes on a Lease of their own, during the handovers)\n", len(fl.write))
	fmt.Printf("    %-54s %s\n", "Lease write round trip (PUT, changed renewTime)", stats.Summary(fl.write))
	fmt.Printf("    %-54s %s\n", "write acknowledged -> watch event received", stats.Summary(fl.event))
	fmt.Printf("    %-54s %s\n", "write sent -> watch event received", stats.Summary(fl.sentToEvent))
	fmt.Printf("    %-54s %s\n", "floor path: ack -> event -> next write acknowledged", stats.Summary(fl.path))
	fmt.Printf("    %-54s %s\n", "disk: 4 KiB write + fsync in etcd's directory", stats.Summary(fl.fsync))
	fmt.Printf("      (not in the writes above: envtest's etcd runs with --unsafe-no-fsync; a real etcd adds its WAL sync to each)\n")
}
