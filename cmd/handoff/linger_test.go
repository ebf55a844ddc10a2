package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

// A scraped sidecar stays, after its sequence and SIGTERM, until a scrape
// has read the sequence's counts: without that, a scraper that comes every
// interval rarely sees a pod's outcome, and no alert on it fires. It then
// exits at once.
func TestSidecarStaysForOneScrapeAfterItsSequence(t *testing.T) {
	env := kubetest.Get(t)
	sp := startSidecarProcess(t, env)
	// A scraper every 2 s: its next visit is due 2 s after its last, and the
	// sidecar waits up to 3 s (1.5 intervals) from that last one.
	before := metricLine(t, sp.metrics, `handoff_shutdowns_total{outcome="Drained"}`)
	time.Sleep(2 * time.Second)
	metricLine(t, sp.metrics, `handoff_shutdowns_total{outcome="Drained"}`)
	if want := `handoff_shutdowns_total{outcome="Drained"} 0`; before != want {
		t.Errorf("before the sequence: %q, want %q (the series at 0 from the start)", before, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The pod is deleted (its grace period, 30 s, running), then the
	// kubelet's preStop and SIGTERM.
	if err := env.Client.CoreV1().Pods(sp.ns).Delete(ctx, sp.pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := prestop.Call(ctx, sp.control, sp.token, 5*time.Second)
	if err != nil || rep.Outcome != protocol.OutcomeDrained {
		t.Fatalf("preStop: %v, %+v; want outcome Drained", err, rep)
	}
	if err := sp.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Without the wait it would be gone within the Events' flush (under a
	// second); it stays for the scrape due a second later.
	time.Sleep(time.Second)
	select {
	case err := <-sp.exited:
		t.Fatalf("the sidecar exited (%v) within a second of SIGTERM, before the scrape due after its sequence", err)
	default:
	}
	if got, want := metricLine(t, sp.metrics, `handoff_shutdowns_total{outcome="Drained"}`), `handoff_shutdowns_total{outcome="Drained"} 1`; got != want {
		t.Errorf("the scrape after the sequence: %q, want %q", got, want)
	}
	start := time.Now()
	select {
	case err := <-sp.exited:
		if err != nil {
			t.Errorf("the sidecar exited with %v, want 0", err)
		}
		t.Logf("exited %s after the scrape", time.Since(start).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the sidecar did not exit within 5s of the scrape it waited for")
	}
}
