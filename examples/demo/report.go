package main

import (
	"fmt"
	"time"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/internal/outcome"
	"github.com/handoff-dev/handoff/internal/procstat"
)

// summary prints both timelines, the comparison and the queue check.
func (d *demo) summary(with, without *replacement, rep queue.Report) {
	fmt.Println()
	for _, r := range []*replacement{with, without} {
		if r.handoff {
			fmt.Printf("== with handoff: %s replaced by %s, preStop at +0 ms\n", r.old, r.newPod)
			for _, line := range r.steps {
				fmt.Println("   " + line)
			}
		} else {
			fmt.Printf("== without handoff (baseline): %s replaced by %s, processes exit at +0 ms\n", r.old, r.newPod)
		}
		if !r.started.IsZero() && r.hops != nil {
			fmt.Printf("   %-9s %s's sequence started; its hops for Lease %s (successor: %s):\n", msf(r.started.Sub(r.t0)), r.old, leaseName, orNone(r.hops.Successor))
			for _, h := range outcome.Hops() {
				if sec, ok := r.hops.Hops[h]; ok {
					at := time.Duration(sec * float64(time.Second))
					fmt.Printf("   %-9s   %s (%s after the sequence started)\n", msf(r.started.Add(at).Sub(r.t0)), h, msf(at))
				}
			}
		}
		fmt.Printf("   %-9s Lease %s held by %s\n", ms(r.leaseTakenAt.Sub(r.t0)), leaseName, r.successor)
		if !r.toldAt.IsZero() {
			fmt.Printf("   %-9s %s's app told it leads (%s after the Lease was seen held)\n", ms(r.toldAt.Sub(r.t0)), r.successor, ms(r.toldAt.Sub(r.leaseTakenAt)))
		}
		if r.stranded > 0 {
			fmt.Printf("   %-9s first of %d unfinished claims claimed again by a survivor (last at %s)\n", ms(r.firstBack), r.stranded, ms(r.lastBack))
		} else {
			fmt.Printf("   no unfinished claims were left by %s\n", r.old)
		}
	}
	fmt.Println()
	fmt.Printf("%-44s %12s %12s\n", "", "handoff", "baseline")
	fmt.Printf("%-44s %12s %12s\n", "Lease held by a successor after", ms(with.leaseTakenAt.Sub(with.t0)), ms(without.leaseTakenAt.Sub(without.t0)))
	told := "-"
	if !with.toldAt.IsZero() {
		told = ms(with.toldAt.Sub(with.t0))
	}
	fmt.Printf("%-44s %12s %12s\n", "successor's app told it leads after", told, "-")
	fmt.Printf("%-44s %12s %12s\n", "unfinished claims back in circulation after", back(with), back(without))
	fmt.Println()
	fmt.Printf("queue check: %s\n", rep)
	if err := rep.Err(); err != nil {
		fmt.Printf("queue check FAILED: %v\n", err)
	} else {
		fmt.Println("queue check: no message lost, none applied twice, no stale leader write")
	}
	d.mu.Lock()
	for _, name := range []string{"pod-a", "pod-b", "pod-c", "pod-d"} {
		if p := d.pods[name]; p != nil && p.sidecar.ProcessState == nil {
			fmt.Printf("sidecar %s resident memory: %s\n", name, rss(p.sidecar.Process.Pid))
		}
	}
	d.mu.Unlock()
	fmt.Printf("logs: %s\n", d.o.dir)
}

func ms(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("+%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("+%.1f s", d.Seconds())
}

// msf is d in milliseconds to a tenth, signed.
func msf(d time.Duration) string {
	return fmt.Sprintf("%+.1f ms", float64(d.Microseconds())/1000)
}

func orNone(s string) string {
	if s == "" {
		return "not looked for"
	}
	return s
}

func back(r *replacement) string {
	if r.stranded == 0 {
		return "none left"
	}
	return ms(r.lastBack)
}

// rss is the resident memory of pid, from /proc.
func rss(pid int) string {
	mem, err := procstat.Memory(pid)
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%.1f MiB", mem["VmRSS"])
}
