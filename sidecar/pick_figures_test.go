package sidecar_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/outcome"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/sidecar"
)

// TestPickFigures prints a role Lease's handover hop by hop with the
// successor's pick the old way (a consistent watch-list) beside the new
// (the watch cache as it is), alternated in one run on one apiserver: a
// chain of pods, each deleted and handing the Lease to the next, a pod of
// a newer revision, with 20 and then 200 other injected pods in the
// namespace and the load "busy" beside (sidecar.StartLoad: 100 Lease
// writes a second, and a consistent list of pods every 50 ms). Both wait
// for the pick up to sidecar.PickWait from the trigger. It asserts only
// that each handover reaches the next pod, named or, its pick late, as
// the only other candidate. It runs when HANDOFF_PICK_FIGURES is set (to
// the handovers per way, 20 if not a number): docs/performance.md, "The
// successor's pick".
func TestPickFigures(t *testing.T) {
	env := os.Getenv("HANDOFF_PICK_FIGURES")
	if env == "" {
		t.Skip("prints figures: set HANDOFF_PICK_FIGURES=1 (docs/performance.md, \"The successor's pick\")")
	}
	rounds, err := strconv.Atoi(env)
	if err != nil || rounds < 1 {
		rounds = 20
	}
	kube := kubetest.Get(t)
	stop := sidecar.StartLoad(t, kube, "busy")
	defer stop()
	var b strings.Builder
	for _, pods := range []int{20, 200} {
		pickFigures(t, kube, pods, rounds, &b)
	}
	t.Log("\n" + b.String())
}

// pickFigures hands a role Lease over rounds times each way in a namespace
// of pods other injected pods, and writes the figures to b (TestPickFigures).
func pickFigures(t *testing.T, kube *kubetest.Env, pods, rounds int, b *strings.Builder) {
	ns := kube.Namespace(t)
	sidecar.MakeInjectedPods(t, kube.Client, ns, pods)
	ways := []struct {
		name string
		rv   string
		wait time.Duration
	}{{"old (consistent)", "", sidecar.PickWait}, {`new (resourceVersion "0")`, "0", sidecar.PickWait}}
	hops := []string{"trigger → revoke acked", "trigger → pick ended/given up", "later of both → release sent",
		"release sent → acked", "release acked → app told", "total: trigger → app told"}
	took := make([][][]time.Duration, len(ways)) // way, hop, samples
	for i := range took {
		took[i] = make([][]time.Duration, len(hops))
	}
	named := make([]int, len(ways))
	values := map[string]string{"role-leases": lease}
	leader := candidatePod(t, ns, "chain-0", "r0", values, nil)
	kubetest.WaitFor(t, 10*time.Second, "chain-0's app to lead", leader.leads)
	for k := range 2 * rounds {
		w := k % len(ways)
		next := candidatePod(t, ns, fmt.Sprintf("chain-%d", k+1), fmt.Sprintf("r%d", k+1), values, nil)
		kubetest.WaitFor(t, 10*time.Second, next.name+"'s election to see the holder", func() bool {
			st := next.c.Status()
			return len(st.Leases) == 1 && st.Leases[0].HolderIdentity == leader.settings.Identity()
		})
		leader.c.SetPick(ways[w].rv, ways[w].wait)
		// As a rollout does: the sidecar's watch of its pod sees the
		// deletion and starts the sequence; the hook joins it.
		grace := int64(30)
		if err := kube.Client.CoreV1().Pods(ns).Delete(context.Background(), leader.name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			t.Fatal(err)
		}
		rep, err := leader.c.Shutdown(context.Background(), prestop.TriggerPreStop)
		if err != nil {
			t.Fatal(err)
		}
		kubetest.WaitFor(t, 5*time.Second, next.name+"'s app to lead", next.leads)
		told := next.calls.firstGrantAfter(rep.Started)
		sum, _ := summary(t, ns, leader.name)
		if len(sum.Leases) != 1 {
			t.Fatalf("handover %d: summary's leases %+v, want one", k, sum.Leases)
		}
		l := sum.Leases[0]
		if l.Successor == outcome.SuccessorNamed {
			named[w]++
		}
		at := func(h outcome.Hop) time.Duration {
			sec, ok := l.Hops[h]
			if !ok {
				return -1
			}
			return time.Duration(sec * float64(time.Second))
		}
		picked := at(outcome.HopSuccessorGivenUp)
		if picked < 0 {
			picked = at(outcome.HopSuccessorPicked)
		}
		acked, sent, released, total := at(outcome.HopRevokeAcked), at(outcome.HopReleaseSent), at(outcome.HopReleaseAcked), told.Sub(rep.Started)
		for i, d := range []time.Duration{acked, picked, sent - max(acked, picked), released - sent, total - released, total} {
			if acked >= 0 && picked >= 0 && sent >= 0 && released >= 0 && !told.IsZero() {
				took[w][i] = append(took[w][i], d)
			}
		}
		leader.stop()
		if err := kube.Client.CoreV1().Pods(ns).Delete(context.Background(), leader.name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		leader = next
	}
	fmt.Fprintf(b, "role Lease handed over %d times each way, alternated; %d other injected pods, load busy; each hop per handover (the trigger: the deletion seen), p50 / p99 / max ms:\n", rounds, pods)
	fmt.Fprintf(b, "  %-32s", "hop")
	for _, w := range ways {
		fmt.Fprintf(b, " | %-34s", w.name)
	}
	b.WriteString("\n")
	for i, h := range hops {
		fmt.Fprintf(b, "  %-32s", h)
		for w := range ways {
			if len(took[w][i]) == 0 {
				fmt.Fprintf(b, " | %-34s", "none")
				continue
			}
			p50, p99, maxd := sidecar.Quantiles(took[w][i])
			fmt.Fprintf(b, " | %-34s", fmt.Sprintf("%.2f / %.2f / %.2f (%d)", p50, p99, maxd, len(took[w][i])))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(b, "  %-32s", "successor named")
	for w := range ways {
		fmt.Fprintf(b, " | %-34s", fmt.Sprintf("%d of %d", named[w], rounds))
	}
	b.WriteString("\n")
}
