package outcomes

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/handoff-dev/handoff/internal/outcome"
	"github.com/handoff-dev/handoff/protocol"
)

// summaryEvent is a ShutdownFinished Event as a sidecar writes it, on pod
// in ns, with the summary of outcome o, last written at at.
func summaryEvent(ns, pod, uid string, o protocol.Outcome, at time.Time, count int32) *corev1.Event {
	s := outcome.Summary{
		V: outcome.Version, Outcome: o, Trigger: protocol.TriggerPreStop,
		Steps:  map[protocol.StepName]float64{protocol.StepStopClaiming: 0.004, protocol.StepDone: 0.05},
		Claims: outcome.Claims{Unfinished: 2, Returned: 2},
		Leases: []outcome.LeaseResult{{Lease: "work", Result: outcome.ResultFailed}},
	}
	if o == protocol.OutcomeDrained {
		s.Claims, s.Leases = outcome.Claims{}, []outcome.LeaseResult{{Lease: "work", Result: outcome.ResultReleased}}
	}
	if o == protocol.OutcomeReturned {
		s.Steps[protocol.StepDrainDeadline] = 0.03
	}
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: pod + "." + uid, Namespace: ns, UID: types.UID(uid),
			Annotations: map[string]string{outcome.Annotation: s.Encode()}},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod},
		Reason:         outcome.Reason, Source: corev1.EventSource{Component: Source}, Type: corev1.EventTypeNormal,
		Message: "Shutdown finished", Count: count,
		FirstTimestamp: metav1.NewTime(at), LastTimestamp: metav1.NewTime(at),
	}
}

func TestCounterCountsEachOccurrenceOnce(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	start := time.Now()
	c := NewCounter(m, start.Add(-DefaultWindow), 0, testr.New(t))

	drained := summaryEvent("shop", "w-0", "u0", protocol.OutcomeDrained, start, 1)
	returned := summaryEvent("shop", "w-1", "u1", protocol.OutcomeReturned, start, 1)
	steps := []struct {
		old, e *corev1.Event
		want   string
	}{
		{nil, drained, EventCounted},
		{nil, drained, EventDuplicate},             // a relist
		{drained, drained, EventDuplicate},         // an update of the same count
		{nil, returned, EventCounted},              // another pod
		{nil, withCount(drained, 3), EventCounted}, // the correlator wrote it twice more: 2 more
		{withCount(drained, 3), withCount(drained, 3), EventDuplicate},
	}
	for i, s := range steps {
		if got := c.Observe(s.old, s.e); got != s.want {
			t.Errorf("step %d: %s, want %s", i, got, s.want)
		}
	}
	check := func(what string, got, want float64) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	check("Drained", testutil.ToFloat64(m.Handovers.WithLabelValues("shop", "Drained")), 3)
	check("Returned", testutil.ToFloat64(m.Handovers.WithLabelValues("shop", "Returned")), 1)
	check("Abandoned (made at 0)", testutil.ToFloat64(m.Handovers.WithLabelValues("shop", "Abandoned")), 0)
	check("returned claims", testutil.ToFloat64(m.Claims.WithLabelValues("shop", ClaimsReturned)), 2)
	check("work released", testutil.ToFloat64(m.LeaseReleases.WithLabelValues("shop", "work", outcome.ResultReleased)), 3)
	check("work failed", testutil.ToFloat64(m.LeaseReleases.WithLabelValues("shop", "work", outcome.ResultFailed)), 1)
	check("counted Events", testutil.ToFloat64(m.Events.WithLabelValues(EventCounted)), 3)
	check("duplicates", testutil.ToFloat64(m.Events.WithLabelValues(EventDuplicate)), 3)
	if n := testutil.CollectAndCount(m.StepSeconds); n != len(protocol.Steps()) {
		t.Errorf("%d step series in shop, want each of the %d at once", n, len(protocol.Steps()))
	}
	if got := histCount(t, m, "shop", protocol.StepDrainDeadline); got != 1 {
		t.Errorf("drain-deadline observed %d times, want 1", got)
	}
	if got := histCount(t, m, "shop", protocol.StepDone); got != 4 {
		t.Errorf("done observed %d times, want 4 (one a sequence)", got)
	}
}

// A new leader counts the Events of its window, not older ones; an
// aggregated one that began before its window counts once.
func TestCounterStartsAtItsWindow(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	since := time.Now().Add(-DefaultWindow)
	c := NewCounter(m, since, 0, testr.New(t))
	old := summaryEvent("shop", "w-0", "old", protocol.OutcomeDrained, since.Add(-time.Second), 1)
	if got := c.Observe(nil, old); got != EventBeforeStart {
		t.Errorf("an Event before the window: %s, want %s", got, EventBeforeStart)
	}
	// Written again later (count 2): that occurrence is in the window, and new.
	if got := c.Observe(old, withLast(withCount(old, 2), since.Add(time.Second))); got != EventCounted {
		t.Errorf("its later occurrence: %s, want %s", got, EventCounted)
	}
	spanning := withLast(withCount(summaryEvent("shop", "w-1", "span", protocol.OutcomeDrained, since.Add(-time.Minute), 1), 5), since.Add(time.Second))
	c.Observe(nil, spanning)
	if got := testutil.ToFloat64(m.Handovers.WithLabelValues("shop", "Drained")); got != 2 {
		t.Errorf("Drained = %v, want 2 (the later occurrence of the first, the last of the second)", got)
	}
}

func TestCounterRefusesWhatItCannotRead(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	c := NewCounter(m, time.Now().Add(-time.Minute), 0, testr.New(t))
	at := time.Now()
	none := summaryEvent("shop", "w-0", "a", protocol.OutcomeDrained, at, 1)
	none.Annotations = nil
	newer := summaryEvent("shop", "w-1", "b", protocol.OutcomeDrained, at, 1)
	newer.Annotations[outcome.Annotation] = `{"v":2,"outcome":"Drained"}`
	other := summaryEvent("shop", "w-2", "c", protocol.OutcomeDrained, at, 1)
	other.Reason = "Drained"
	for _, c2 := range []struct {
		e    *corev1.Event
		want string
	}{{none, EventInvalid}, {newer, EventUnsupported}, {other, ""}} {
		if got := c.Observe(nil, c2.e); got != c2.want {
			t.Errorf("%s: %q, want %q", c2.e.UID, got, c2.want)
		}
	}
	if n := testutil.CollectAndCount(m.Handovers); n != 0 {
		t.Errorf("%d handover series, want none", n)
	}
}

// A forgotten Event (past the Counter's memory) updated later counts from
// its previous version's count.
func TestCounterForgetsByLeastRecentlySeen(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	c := NewCounter(m, time.Now().Add(-time.Minute), 2, testr.New(t))
	at := time.Now()
	first := summaryEvent("shop", "w-0", "e0", protocol.OutcomeDrained, at, 1)
	c.Observe(nil, first)
	c.Observe(nil, summaryEvent("shop", "w-1", "e1", protocol.OutcomeDrained, at, 1))
	c.Observe(nil, summaryEvent("shop", "w-2", "e2", protocol.OutcomeDrained, at, 1))
	if got := c.Observe(first, withCount(first, 2)); got != EventCounted {
		t.Errorf("the forgotten Event's second occurrence: %s, want %s", got, EventCounted)
	}
	if got := testutil.ToFloat64(m.Handovers.WithLabelValues("shop", "Drained")); got != 4 {
		t.Errorf("Drained = %v, want 4", got)
	}
}

// The Runner on a fake clientset: of two replicas, the one that leads
// counts each Event once; the other counts nothing.
func TestRunnerCountsOnTheLeaderOnly(t *testing.T) {
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Written before the replicas start, in the new leader's window: the
	// fake's watch has no resource versions, so these come in its list.
	for i := range 3 {
		e := summaryEvent("shop", fmt.Sprintf("w-%d", i), fmt.Sprintf("u%d", i), protocol.OutcomeDrained, time.Now(), 1)
		if _, err := client.CoreV1().Events("shop").Create(ctx, e, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	type replica struct {
		m       *Metrics
		started chan *Counter
	}
	var rs []replica
	for i := range 2 {
		r := replica{m: NewMetrics(prometheus.NewRegistry()), started: make(chan *Counter, 1)}
		run := &Runner{Client: client, Namespace: "handoff", Lease: "handoff-outcomes", Identity: fmt.Sprintf("replica-%d", i),
			Metrics: r.m, Log: testr.New(t), counting: func(c *Counter) { r.started <- c }}
		done := make(chan struct{})
		go func() { defer close(done); _ = run.Start(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		rs = append(rs, r)
	}
	var leader replica
	select {
	case <-rs[0].started:
		leader = rs[0]
	case <-rs[1].started:
		leader = rs[1]
	case <-time.After(10 * time.Second):
		t.Fatal("no replica leads within 10s")
	}
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(leader.m.Handovers.WithLabelValues("shop", "Drained")) != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the leader counted %v Drained, want 3 (events counted %v, before start %v, dup %v, invalid %v)", testutil.ToFloat64(leader.m.Handovers.WithLabelValues("shop", "Drained")), testutil.ToFloat64(leader.m.Events.WithLabelValues(EventCounted)), testutil.ToFloat64(leader.m.Events.WithLabelValues(EventBeforeStart)), testutil.ToFloat64(leader.m.Events.WithLabelValues(EventDuplicate)), testutil.ToFloat64(leader.m.Events.WithLabelValues(EventInvalid)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if testutil.ToFloat64(leader.m.Leader) != 1 {
		t.Error("the leader's handoff_outcome_counter_leader is not 1")
	}
	for _, r := range rs {
		if r.m != leader.m && (testutil.CollectAndCount(r.m.Handovers) != 0 || testutil.ToFloat64(r.m.Leader) != 0) {
			t.Error("the replica that does not lead counts")
		}
	}
}

func withCount(e *corev1.Event, n int32) *corev1.Event {
	c := e.DeepCopy()
	c.Count = n
	return c
}

func withLast(e *corev1.Event, at time.Time) *corev1.Event {
	c := e.DeepCopy()
	c.LastTimestamp = metav1.NewTime(at)
	return c
}

// histCount is how many observations handoff_handover_step_seconds has of
// step in ns.
func histCount(t *testing.T, m *Metrics, ns string, step protocol.StepName) uint64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.StepSeconds)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, metric := range mf.GetMetric() {
			var labels []string
			for _, l := range metric.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			if strings.Join(labels, ",") == "namespace="+ns+",step="+string(step) {
				return metric.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}
