package sidecar_test

import (
	"context"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/worker"
)

// The app's count of unstarted claims at stop-claiming (DrainStatus
// unstarted) is reported: in the Report, the stop-claiming step, the
// DrainStarted Event and a metric. The app hands them back at once, so the
// drain waits only for the started one.
func TestUnstartedClaimsAtStopClaimingAreReported(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	handedBack := make(chan int, 1)
	a := newPod(t, ns, "pod-a", map[string]string{"leases": ""}, worker.Options{
		HandBack: func(_ context.Context, claims []*worker.Claim) error { handedBack <- len(claims); return nil },
	})
	r, err := a.agent.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	started := r.Hold()
	r.HoldUnstarted(1)
	r.HoldUnstarted(2)
	r.End()
	go func() { <-a.agent.Stopping(); <-handedBack; started.Done() }()

	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcome != protocol.OutcomeDrained || rep.UnstartedAtStopClaiming != 2 {
		t.Fatalf("outcome %s, unstarted at stop-claiming %d: want Drained, 2", rep.Outcome, rep.UnstartedAtStopClaiming)
	}
	var detail string
	for _, s := range rep.Steps {
		if s.Name == protocol.StepStopClaiming {
			detail = s.Detail
		}
	}
	if detail != "3 in flight, 2 of them unstarted" {
		t.Errorf("stop-claiming step detail %q, want the in-flight and unstarted counts", detail)
	}
	if msgs := events(t, ns, "pod-a", sidecar.ReasonDrainStarted); len(msgs) == 0 || !strings.Contains(msgs[0], "3 in flight (2 unstarted") {
		t.Errorf("DrainStarted events %q do not give the unstarted count", msgs)
	}
	if n := value(t, a.metrics.ClaimsUnstarted); n != 2 {
		t.Errorf("handoff_claims_unstarted_at_stop_claiming_total = %v, want 2", n)
	}
}
