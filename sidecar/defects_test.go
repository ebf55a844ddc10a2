package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/sockettest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/worker"
)

// The sidecar serves the control API before Start: a preStop in that window
// must run the sequence, not call a nil cancel func.
func TestShutdownBeforeStart(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	obj := env.Pod(t, ns, "pod-a", 30)
	agent := newAgent(t, worker.Options{Logger: testr.New(t)})
	app := httptest.NewServer(agent.Handler())
	t.Cleanup(app.Close)
	s, err := config.Load(config.Map(map[string]string{
		"pod-name": "pod-a", "pod-namespace": ns, "pod-uid": string(obj.UID), "leases": lease,
		"lease-duration": "3s", "renew-deadline": "2s", "retry-period": "250ms", "app-url": app.URL,
	}, "test"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := sidecar.New(sidecar.Options{Token: testToken, Settings: s, Leases: env.Client.CoordinationV1(), Pods: env.Client.CoreV1(),
		Metrics: sidecar.NewMetrics(prometheus.NewRegistry()), Logger: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	control, _ := sockettest.Serve(t, "control.sock", c.ControlHandler())
	rep, err := prestop.Call(context.Background(), control, testToken, time.Second)
	if err != nil {
		t.Fatalf("preStop before Start: %v", err)
	}
	if rep.Outcome != protocol.OutcomeDrained || len(rep.Errors) > 0 || len(rep.Leases) != 1 || rep.Leases[0].WasLeader {
		t.Errorf("report %+v: want Drained, no error, the Lease not held", rep)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx) // after the sequence: the round is over, no election starts
	cancel()
	c.Wait()
}

// Once the sequence has started, a Lease the pod loses is not competed for
// again, and no new grant reaches the stopping app.
func TestLeaseLostDuringDrainIsNotRetaken(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	_, done, err := a.agent.Begin(context.Background()) // keeps the drain going
	if err != nil {
		t.Fatal(err)
	}
	reports := make(chan *protocol.Report, 1)
	go func() {
		rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
		if err != nil {
			t.Error(err)
		}
		reports <- rep
	}()
	<-a.agent.Stopping()

	// Another candidate takes the Lease; pod-a's renewals fail until its
	// renew deadline, and it loses it.
	leases := env.Client.CoordinationV1().Leases(ns)
	steal := func(holder string) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			l, err := leases.Get(context.Background(), lease, metav1.GetOptions{})
			if err != nil {
				return err
			}
			l.Spec.HolderIdentity = ptr.To(holder)
			l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			_, err = leases.Update(context.Background(), l, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	steal("thief")
	kubetest.WaitFor(t, 10*time.Second, "pod-a to see it lost the Lease", func() bool {
		st := a.c.Status()
		return !st.Leases[0].Leader && st.Leases[0].HolderIdentity == "thief"
	})
	lost := time.Now() // no renewal of the old term after this
	// The thief frees it: a pod still competing would take it at once
	// (its standby watches the Lease).
	steal("")
	time.Sleep(1500 * time.Millisecond) // six retry periods: room for a re-acquisition to show
	l, err := leases.Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" {
		t.Errorf("the Lease is held by %q after the thief freed it: the leaving pod competed again", h)
	}
	if n := a.calls.grantsSince(lost); n > 0 {
		t.Errorf("%d grants reached the stopping app after it lost the Lease", n)
	}
	done()
	rep := <-reports
	if rep == nil || rep.Outcome != protocol.OutcomeDrained {
		t.Fatalf("report %+v, want Drained", rep)
	}
}

// An app that answers the drain poll at once, ignoring waitMillis, is
// polled at most once per pacing interval.
func TestDrainPollsArePaced(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := newPod(t, ns, "pod-a", map[string]string{"leases": ""}, worker.Options{})
	if _, _, err := a.agent.Begin(context.Background()); err != nil { // never finishes
		t.Fatal(err)
	}
	inner := a.agent.Handler()
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == protocol.DrainPath {
			q := r.URL.Query()
			q.Set("waitMillis", "0") // the app does not wait
			r.URL.RawQuery = q.Encode()
		}
		inner.ServeHTTP(w, r)
	})
	a.app.Store(&h)
	grace := int64(4)
	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), "pod-a", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	var from, to time.Time
	for _, s := range rep.Steps {
		switch s.Name {
		case sidecar.StepStopClaiming:
			from = s.At
		case sidecar.StepDrainDeadline:
			to = s.At
		}
	}
	if from.IsZero() || to.IsZero() {
		t.Fatalf("steps %v: want stop-claiming and drain-deadline", stepNames(rep))
	}
	polls := a.calls.count(protocol.DrainPath)
	if most := int(to.Sub(from)/(100*time.Millisecond)) + 2; polls > most {
		t.Errorf("%d drain polls in %s, want at most %d (one per 100ms)", polls, to.Sub(from), most)
	}
	t.Logf("%d drain polls in %s", polls, to.Sub(from))
}

// A new sidecar process with the same identity (the kubelet restarted the
// sidecar container) picks up the Lease that still names it, without
// waiting for it to expire, and tells the worker with a higher sequence and
// the same fencing token: it is the same holder.
func TestRestartedSidecarPicksUpItsLease(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)

	// The sidecar process dies: no revoke, no release.
	a.c.Abandon()
	a.stop()
	before, _ := a.calls.lastGrant()
	leases := env.Client.CoordinationV1().Leases(ns)
	held, err := leases.Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(held.Spec.HolderIdentity, ""); h != a.settings.Identity() {
		t.Fatalf("after the kill the Lease names %q, want %q", h, a.settings.Identity())
	}
	// A standby could take the Lease from here on (client-go compares
	// renew times at one-second resolution).
	expires := held.Spec.RenewTime.Time.Truncate(time.Second).Add(time.Duration(*held.Spec.LeaseDurationSeconds) * time.Second)

	a.c, a.stop = a.startSidecar(t, sidecar.NewMetrics(prometheus.NewRegistry()))
	var after protocol.Leadership
	kubetest.WaitFor(t, 10*time.Second, "the new sidecar's grant", func() bool {
		a.calls.mu.Lock()
		defer a.calls.mu.Unlock()
		for _, g := range a.calls.grants {
			if g.Sequence > before.Sequence {
				after = g
				return true
			}
		}
		return false
	})
	if after.FencingToken != before.FencingToken {
		t.Errorf("fencing token %d after the restart, want the same holder's %d", after.FencingToken, before.FencingToken)
	}
	if sent := time.Unix(0, after.Sequence); !sent.Before(expires) {
		t.Errorf("the new sidecar granted at %s, not before the Lease could expire at %s: it waited the Lease out", sent, expires)
	}
	again, err := leases.Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(again.Spec.HolderIdentity, "") != a.settings.Identity() || ptr.Deref(again.Spec.LeaseTransitions, 0) != ptr.Deref(held.Spec.LeaseTransitions, 0) {
		t.Errorf("Lease holder %q, transitions %d: want %q and %d (renewed by the same holder, not taken over)",
			ptr.Deref(again.Spec.HolderIdentity, ""), ptr.Deref(again.Spec.LeaseTransitions, 0), a.settings.Identity(), ptr.Deref(held.Spec.LeaseTransitions, 0))
	}
	kubetest.WaitFor(t, 5*time.Second, "the app to lead under the new sidecar", a.leads)
}

// hangingLeases is a Lease client whose writes hang, once hang is set,
// until their context ends: a holder cut off from the API.
type hangingLeases struct {
	coordinationv1client.LeasesGetter
	hang *atomic.Bool
}

func (h hangingLeases) Leases(ns string) coordinationv1client.LeaseInterface {
	return hangingLease{h.LeasesGetter.Leases(ns), h.hang}
}

type hangingLease struct {
	coordinationv1client.LeaseInterface
	hang *atomic.Bool
}

func (h hangingLease) Update(ctx context.Context, l *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if h.hang.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.LeaseInterface.Update(ctx, l, o)
}

// Patch hangs as Update does: the leftover release's write.
func (h hangingLease) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, o metav1.PatchOptions, sub ...string) (*coordinationv1.Lease, error) {
	if h.hang.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.LeaseInterface.Patch(ctx, name, pt, data, o, sub...)
}

// When the holder's Lease writes hang past its renew deadline, the app is
// told its term is over at the end of the term it was granted, before the
// standby takes the Lease, not when client-go gives up after its release
// attempt.
func TestAppToldAtTheEndOfItsTermWhenRenewalsHang(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	var hang atomic.Bool
	a := startPod(t, env.Pod(t, ns, "pod-a", 30), nil, worker.Options{}, hangingLeases{env.Client.CoordinationV1(), &hang})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	b := newPod(t, ns, "pod-b", nil, worker.Options{})
	hang.Store(true)
	kubetest.WaitFor(t, 15*time.Second, "b's app to lead", b.leads)
	l, err := env.Client.CoordinationV1().Leases(ns).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	acquired := l.Spec.AcquireTime.Time
	a.calls.mu.Lock()
	revokes, lastUntil := append([]time.Time(nil), a.calls.revokes...), a.calls.lastUntil
	a.calls.mu.Unlock()
	if len(revokes) == 0 {
		t.Fatalf("a's app was never told its term ended; b acquired at %s", acquired)
	}
	if !revokes[0].Before(acquired) {
		t.Errorf("a's app told its term ended at %s, after b acquired the Lease at %s (a's last term until %s)", revokes[0], acquired, lastUntil)
	}
}

// exitOn makes the pod's app exit, the way a process does, when it gets a
// request that matches: it stops listening (later connections are refused)
// and resets the connection of that request.
func (p *pod) exitOn(t *testing.T, match func(*http.Request, []byte) bool) {
	t.Helper()
	inner := *p.app.Load()
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !match(r, body) {
			inner.ServeHTTP(w, r)
			return
		}
		_ = p.appLn.Close() // the socket is removed: later dials find none
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		if tcp, ok := conn.(*net.TCPConn); ok {
			_ = tcp.SetLinger(0) // RST, not FIN
		}
		_ = conn.Close()
	})
	p.app.Store(&h)
}

// An app that finishes and exits at once resets the connection of the
// revoke: it is gone, so its term is over; the sequence does not wait the
// term out and reports no error (the hook exits 0).
func TestAppThatExitsAtTheRevokeIsGone(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	a := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	a.exitOn(t, func(r *http.Request, body []byte) bool {
		var l protocol.Leadership
		return r.Method == http.MethodPut && json.Unmarshal(body, &l) == nil && !l.Leader
	})
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Errors) > 0 || !rep.Leases[0].Released || strings.Contains(rep.Leases[0].Detail, "waited") {
		t.Errorf("errors %v, lease %+v: want no error and the Lease released at once", rep.Errors, rep.Leases[0])
	}
	if want := []string{"triggered", "stop-claiming", "drained", "leadership-revoked", "lease-released", "done"}; strings.Join(stepNames(rep), ",") != strings.Join(want, ",") {
		t.Errorf("steps %v, want %v", stepNames(rep), want)
	}
}

// An app that exits mid-drain with claims in flight leaves them to the
// visibility timeout: the report counts them from its last status.
func TestAppGoneMidDrainCountsAbandonedClaims(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	a := newPod(t, ns, "pod-a", map[string]string{"leases": ""}, worker.Options{})
	for range 2 {
		if _, _, err := a.agent.Begin(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	a.exitOn(t, func(r *http.Request, _ []byte) bool { return r.URL.Path == protocol.DrainPath })
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcome != protocol.OutcomeAppGone || rep.Abandoned != 2 || len(rep.Errors) > 0 {
		t.Errorf("outcome %s, abandoned %d, errors %v: want AppGone, 2, none", rep.Outcome, rep.Abandoned, rep.Errors)
	}
}

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

// A release that is not written (the Lease writes hang until the release's
// context ends) is a failure of the sequence: the report carries the error,
// so `handoff prestop` exits non-zero, and a HandoverFailed Event says why.
func TestReleaseNotWrittenFailsTheSequence(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	var hang atomic.Bool
	a := startPod(t, env.Pod(t, ns, "pod-a", 30), nil, worker.Options{}, hangingLeases{env.Client.CoordinationV1(), &hang})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	hang.Store(true)
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Leases) != 1 || rep.Leases[0].Released || !rep.Leases[0].WasLeader {
		t.Fatalf("Leases in the report %+v; want %s, was leader, not released", rep.Leases, lease)
	}
	if len(rep.Errors) == 0 || !strings.Contains(strings.Join(rep.Errors, "\n"), "releasing Lease "+lease) {
		t.Errorf("report errors %q; want the release of %s named", rep.Errors, lease)
	}
	kubetest.WaitFor(t, 10*time.Second, "the HandoverFailed Event", func() bool {
		return len(events(t, ns, "pod-a", sidecar.ReasonHandoverFailed)) == 1
	})
}
