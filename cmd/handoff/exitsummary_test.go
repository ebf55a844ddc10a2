package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/outcome"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

// A scraped sidecar does not stay for a scrape after its sequence: it
// exits as soon as its Events and its pod condition are written, and the
// sequence's outcome is on the pod, in the ShutdownFinished Event's
// summary, which the webhook's outcome counter counts. (It used to wait
// up to 1.5 scrape intervals, metrics-linger, for a scrape of its own
// counters.)
func TestSidecarExitsAtOnceWithItsSummaryWritten(t *testing.T) {
	env := kubetest.Get(t)
	sp := startSidecarProcess(t, env)
	// A scraper every 2 s, as one that the old linger would have waited for.
	metricLine(t, sp.metrics, `handoff_shutdowns_total{outcome="Drained"}`)
	time.Sleep(2 * time.Second)
	metricLine(t, sp.metrics, `handoff_shutdowns_total{outcome="Drained"}`)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := env.Client.CoreV1().Pods(sp.ns).Delete(ctx, sp.pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := prestop.Call(ctx, sp.control, sp.token, 5*time.Second)
	if err != nil || rep.Outcome != protocol.OutcomeDrained {
		t.Fatalf("preStop: %v, %+v; want outcome Drained", err, rep)
	}
	start := time.Now()
	if err := sp.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-sp.exited:
		if err != nil {
			t.Errorf("the sidecar exited with %v, want 0", err)
		}
		t.Logf("exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
	case <-time.After(2500 * time.Millisecond):
		// Its Event flush and phase write are a second each at most; the
		// next scrape was due 2 s after the last, 3 s at the old linger's bound.
		t.Fatal("the sidecar did not exit within 2.5s of SIGTERM: it waits for something past its Events and phase")
	}
	es, err := env.Client.CoreV1().Events(sp.ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + outcome.Reason})
	if err != nil {
		t.Fatal(err)
	}
	if len(es.Items) != 1 {
		t.Fatalf("%d %s Events on the pod, want 1", len(es.Items), outcome.Reason)
	}
	s, err := outcome.Decode(es.Items[0].Annotations[outcome.Annotation])
	if err != nil {
		t.Fatal(err)
	}
	if s.Outcome != protocol.OutcomeDrained || len(s.Leases) != 1 || s.Leases[0].Lease != "work" || s.Leases[0].Result != outcome.ResultReleased {
		t.Errorf("summary %+v: want Drained with Lease work released", s)
	}
	if _, ok := s.Leases[0].Hops[outcome.HopReleaseAcked]; !ok {
		t.Errorf("summary's hops of Lease work %v: no %s", s.Leases[0].Hops, outcome.HopReleaseAcked)
	}
	if _, ok := s.Steps[protocol.StepDone]; !ok {
		t.Errorf("summary steps %v: no %s", s.Steps, protocol.StepDone)
	}
}
