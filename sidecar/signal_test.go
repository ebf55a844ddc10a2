package sidecar_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	corev1 "k8s.io/api/core/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/worker"
)

// SIGTERM to the sidecar in a pod that stays is a restart of the sidecar
// container alone: the worker is not told to stop claiming, the Lease is
// not released (it still names the pod when the sidecar has stopped), and a
// SidecarRestart Event says so. In a pod being deleted, SIGTERM runs the
// sequence and releases.
func TestSignalInAPodThatStaysKeepsWorkerAndLease(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)

	rep, err := a.c.Signal(context.Background())
	if !errors.Is(err, sidecar.ErrSidecarRestart) || rep != nil {
		t.Fatalf("Signal in a pod that stays = %v, %v; want ErrSidecarRestart", rep, err)
	}
	a.stop()
	if n := a.calls.count(protocol.StopClaimingPath); n != 0 {
		t.Errorf("the app was told to stop claiming %d times; want never", n)
	}
	select {
	case <-a.agent.Stopping():
		t.Error("the worker stopped claiming")
	default:
	}
	held, err := env.Client.CoordinationV1().Leases(ns).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(held.Spec.HolderIdentity, ""); h != a.settings.Identity() {
		t.Errorf("after the sidecar stopped the Lease names %q; want %q, kept for the next sidecar process", h, a.settings.Identity())
	}
	kubetest.WaitFor(t, 10*time.Second, "the SidecarRestart Event", func() bool {
		return len(events(t, ns, "pod-a", sidecar.ReasonSidecarRestart)) == 1
	})

	// The same in a pod being deleted: the sequence runs and releases.
	b := newPod(t, ns, "pod-b", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-b's app to lead", b.leads)
	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), "pod-b", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](20)}); err != nil {
		t.Fatal(err)
	}
	// Wait for the sidecar's own watch, not the API server: a signal that
	// came first would start the sequence itself, with trigger SIGTERM.
	kubetest.WaitFor(t, 10*time.Second, "the sidecar to start the sequence at the deletion", func() bool {
		return b.c.Status().Phase != protocol.PhaseRunning
	})
	// The watch of the pod's own object started the sequence at the
	// deletion; the signal joins it and gets its report.
	rep, err = b.c.Signal(context.Background())
	if err != nil || rep == nil || rep.Trigger != sidecar.TriggerDeletion {
		t.Fatalf("Signal in a pod being deleted = %+v, %v; want the report of the sequence the deletion started", rep, err)
	}
	if len(rep.Leases) != 1 || !rep.Leases[0].Released {
		t.Errorf("Leases in the report %+v; want %s released", rep.Leases, lease)
	}
}

// gatedPods is the real API's pods client whose next Get, once armed,
// waits for gate: a slow read of the pod, to open a race window.
type gatedPods struct {
	typedcorev1.CoreV1Interface
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedPods) Pods(ns string) typedcorev1.PodInterface {
	return &gatedPodIf{PodInterface: g.CoreV1Interface.Pods(ns), g: g}
}

type gatedPodIf struct {
	typedcorev1.PodInterface
	g *gatedPods
}

func (p *gatedPodIf) Get(ctx context.Context, name string, o metav1.GetOptions) (*corev1.Pod, error) {
	if p.g.armed.CompareAndSwap(true, false) {
		close(p.g.entered)
		<-p.g.gate
	}
	return p.PodInterface.Get(ctx, name, o)
}

// SIGTERM to the sidecar (Signal) in a pod that stays, racing a preStop:
// Signal sees no sequence and reads the pod; meanwhile the preStop starts a
// sequence. Signal joins that sequence (the sidecar stays until it is over)
// rather than take the SIGTERM for a restart of the sidecar's container,
// which would exit the sidecar in the middle of the sequence and withhold
// the release the sequence is about to write.
func TestSignalRacingAPreStopJoinsItsSequence(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	p.stop() // this sidecar process ends; the next one reads the pod slowly

	gp := &gatedPods{CoreV1Interface: env.Client.CoreV1(), entered: make(chan struct{}), gate: make(chan struct{})}
	c, err := sidecar.New(sidecar.Options{Token: testToken, Settings: p.settings, Leases: env.Client.CoordinationV1(), Pods: gp,
		Metrics: sidecar.NewMetrics(prometheus.NewRegistry()), Logger: testr.New(t).WithName("pod-a/2")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	t.Cleanup(func() { cancel(); c.Wait() })
	kubetest.WaitFor(t, 10*time.Second, "the second sidecar to lead", func() bool {
		st := c.Status()
		return len(st.Leases) == 1 && st.Leases[0].Leader
	})
	// Let the watch sync, so Signal's read is watch + one GET.
	time.Sleep(time.Second)

	gp.armed.Store(true)
	type res struct {
		rep *protocol.Report
		err error
	}
	sig := make(chan res, 1)
	go func() { r, err := c.Signal(context.Background()); sig <- res{r, err} }()
	<-gp.entered // Signal saw phase Running and is reading the pod
	pre := make(chan res, 1)
	go func() { r, err := c.Shutdown(context.Background(), prestop.TriggerPreStop); pre <- res{r, err} }()
	// Started, or already over: with nothing to drain it can end (and
	// wait to re-arm) within a few ms, between two polls.
	kubetest.WaitFor(t, 5*time.Second, "the preStop's sequence to start", func() bool {
		ph := c.Status().Phase
		return ph == sidecar.PhaseShuttingDown || ph == sidecar.PhaseRearming
	})
	close(gp.gate)
	s := <-sig
	r := <-pre
	if r.err != nil {
		t.Fatal(r.err)
	}
	if errors.Is(s.err, sidecar.ErrSidecarRestart) {
		t.Errorf("Signal returned ErrSidecarRestart while the preStop's sequence ran: the sidecar would exit mid-sequence")
	}
	if len(r.rep.Leases) != 1 || !r.rep.Leases[0].Released || len(r.rep.Errors) != 0 {
		t.Errorf("preStop's sequence: leases %+v, errors %q; want the Lease released, no errors", r.rep.Leases, r.rep.Errors)
	}
}

// SIGTERM to the sidecar with the pod's reads hanging (an apiserver that
// does not answer): Signal reads the pod for up to the pod read
// timeout (2 s) to tell a restart of its container from a deletion, but
// the sequence's deadline (grace period less margin) counts from the
// SIGTERM, not from the end of that read: counted from there, it would lie
// up to 2 s past the kubelet's, at the SIGKILL with the default
// deadline-margin of 2 s.
func TestSignalDeadlineCountsFromTheSIGTERM(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p, c := restartedWithHangingPodReads(t, env, ns)
	sigterm := time.Now()
	rep, err := c.Signal(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := sigterm.Add(p.settings.GracePeriod - p.settings.DeadlineMargin)
	if late := rep.Deadline.Sub(want); late > 500*time.Millisecond {
		t.Errorf("deadline %s is %s after SIGTERM + grace period - margin (%s); sequence started %s after the SIGTERM",
			rep.Deadline.Format(time.RFC3339Nano), late, want.Format(time.RFC3339Nano), rep.Started.Sub(sigterm))
	}
}
