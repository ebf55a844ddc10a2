package outcomes

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/outcome"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
)

func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		// The unit tests need no control plane; the integration test skips.
		os.Exit(m.Run())
	}
	kubetest.Run(m)
}

// On a real kube-apiserver: Events written as the sidecars write them (a
// broadcaster with the sidecar's correlator options, on the pods), one
// written twice so that the correlator patches it to count 2, are counted
// exactly once per occurrence by the replica that leads, of two; the
// other counts nothing.
func TestCountsTheSidecarsEventsOnceOnARealAPIServer(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS not set: no control plane")
	}
	env := kubetest.Get(t)
	ns, lns := env.Namespace(t), env.Namespace(t)
	pods := []*corev1.Pod{env.Pod(t, ns, "worker-0", 30), env.Pod(t, ns, "worker-1", 30), env.Pod(t, ns, "worker-2", 30)}
	b := record.NewBroadcaster(record.WithCorrelatorOptions(sidecar.CorrelatorOptions()))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: env.Client.CoreV1().Events(ns)})
	t.Cleanup(b.Shutdown)
	rec := b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "handoff"})
	started := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	write := func(pod *corev1.Pod, o protocol.Outcome, seq int, lease, result string) {
		s := outcome.Summary{V: outcome.Version, Outcome: o, Trigger: protocol.TriggerPreStop,
			Steps:  map[protocol.StepName]float64{protocol.StepStopClaiming: 0.002, protocol.StepDone: 0.04},
			Leases: []outcome.LeaseResult{{Lease: lease, Result: result}}}
		if o == protocol.OutcomeAbandoned {
			s.Steps[protocol.StepDrainDeadline] = 0.03
			s.Claims = outcome.Claims{Unfinished: 4, Abandoned: 4}
		}
		rec.AnnotatedEventf(pod, map[string]string{outcome.Annotation: s.Encode()}, corev1.EventTypeNormal, outcome.Reason,
			"%s", s.Message(started.Add(time.Duration(seq)), 40*time.Millisecond))
	}
	// Before the counters start, within their window: in the list.
	write(pods[0], protocol.OutcomeDrained, 0, "work", outcome.ResultReleased)
	waitEvents(t, ns, 1)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ms := []*Metrics{NewMetrics(prometheus.NewRegistry()), NewMetrics(prometheus.NewRegistry())}
	for i, m := range ms {
		r := &Runner{Client: env.Client, Namespace: lns, Lease: "handoff-outcomes", Identity: fmt.Sprintf("replica-%d", i), Metrics: m, Log: testr.New(t)}
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Start(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	var leader *Metrics
	kubetest.WaitFor(t, 20*time.Second, "a replica to lead and count the listed Event", func() bool {
		for _, m := range ms {
			if testutil.ToFloat64(m.Handovers.WithLabelValues(ns, "Drained")) == 1 {
				leader = m
				return true
			}
		}
		return false
	})
	// Then, through the watch: an abandoned drain written twice (one
	// Event, count 2), another pod's, and a last one.
	write(pods[1], protocol.OutcomeAbandoned, 1, "work", outcome.ResultFailed)
	write(pods[1], protocol.OutcomeAbandoned, 1, "work", outcome.ResultFailed)
	write(pods[2], protocol.OutcomeDrained, 2, "work", outcome.ResultReleased)
	waitEvents(t, ns, 3)
	kubetest.WaitFor(t, 10*time.Second, "the aggregated Event to be written with count 2", func() bool {
		es, err := env.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=worker-1"})
		return err == nil && len(es.Items) == 1 && es.Items[0].Count == 2
	})
	write(pods[0], protocol.OutcomeDrained, 3, "work", outcome.ResultReleased) // the last: seen after the others
	kubetest.WaitFor(t, 10*time.Second, "the leader to count the last Event", func() bool {
		return testutil.ToFloat64(leader.Handovers.WithLabelValues(ns, "Drained")) >= 3
	})
	for what, c := range map[string]struct {
		got  prometheus.Collector
		want float64
	}{
		"Drained":            {leader.Handovers.WithLabelValues(ns, "Drained"), 3},
		"Abandoned":          {leader.Handovers.WithLabelValues(ns, "Abandoned"), 2},
		"claims abandoned":   {leader.Claims.WithLabelValues(ns, ClaimsAbandoned), 8},
		"work failed":        {leader.LeaseReleases.WithLabelValues(ns, "work", outcome.ResultFailed), 2},
		"work released":      {leader.LeaseReleases.WithLabelValues(ns, "work", outcome.ResultReleased), 3},
		"Events not counted": {leader.Events.WithLabelValues(EventInvalid), 0},
		"leader":             {leader.Leader, 1},
	} {
		if got := testutil.ToFloat64(c.got); got != c.want {
			t.Errorf("%s = %v, want %v", what, got, c.want)
		}
	}
	if got := histCount(t, leader, ns, protocol.StepDrainDeadline); got != 2 {
		t.Errorf("drain-deadline steps %d, want 2", got)
	}
	for _, m := range ms {
		// (The wait above made its Drained series, at 0.)
		if m != leader && (testutil.ToFloat64(m.Handovers.WithLabelValues(ns, "Drained")) != 0 || testutil.ToFloat64(m.Events.WithLabelValues(EventCounted)) != 0 || testutil.ToFloat64(m.Leader) != 0) {
			t.Error("the replica that does not lead counts")
		}
	}
}

// waitEvents waits for n ShutdownFinished Events in ns.
func waitEvents(t *testing.T, ns string, n int) {
	t.Helper()
	kubetest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d %s Events in %s", n, outcome.Reason, ns), func() bool {
		es, err := kubetest.Get(t).Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: FieldSelector})
		return err == nil && len(es.Items) == n
	})
}

// A failover on a real apiserver: the leader stops (its Lease released),
// the other replica takes over and counts the Events written from its
// start less its window, not the older ones its predecessor counted.
func TestANewLeaderCountsFromItsWindowOnARealAPIServer(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS not set: no control plane")
	}
	env := kubetest.Get(t)
	ns, lns := env.Namespace(t), env.Namespace(t)
	pod := env.Pod(t, ns, "worker-0", 30)
	b := record.NewBroadcaster(record.WithCorrelatorOptions(sidecar.CorrelatorOptions()))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: env.Client.CoreV1().Events(ns)})
	t.Cleanup(b.Shutdown)
	rec := b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "handoff"})
	seq := 0
	write := func() {
		seq++
		s := outcome.Summary{V: outcome.Version, Outcome: protocol.OutcomeDrained, Steps: map[protocol.StepName]float64{protocol.StepDone: 0.01}}
		rec.AnnotatedEventf(pod, map[string]string{outcome.Annotation: s.Encode()}, corev1.EventTypeNormal, outcome.Reason,
			"%s", s.Message(time.Unix(0, int64(seq)), time.Millisecond))
	}
	start := func(id string, m *Metrics, window time.Duration) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		r := &Runner{Client: env.Client, Namespace: lns, Lease: "handoff-outcomes", Identity: id, Metrics: m, Log: testr.New(t), Window: window}
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Start(ctx) }()
		stop = func() { cancel(); <-done }
		t.Cleanup(stop)
		return stop
	}
	drained := func(m *Metrics) float64 { return testutil.ToFloat64(m.Handovers.WithLabelValues(ns, "Drained")) }

	first := NewMetrics(prometheus.NewRegistry())
	stopFirst := start("replica-0", first, DefaultWindow)
	kubetest.WaitFor(t, 20*time.Second, "replica-0 to lead", func() bool { return testutil.ToFloat64(first.Leader) == 1 })
	write()
	write()
	kubetest.WaitFor(t, 10*time.Second, "replica-0 to count 2", func() bool { return drained(first) == 2 })
	// The second starts while the first leads, with a window of 1 ms: the
	// two Events are older than that when it takes over, once their
	// timestamps' second is over.
	es, err := env.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: FieldSelector})
	if err != nil {
		t.Fatal(err)
	}
	var last time.Time
	for _, e := range es.Items {
		last = maxTime(last, e.LastTimestamp.Time)
	}
	kubetest.WaitFor(t, 5*time.Second, "the Events' second to be over", func() bool { return time.Now().After(last.Add(time.Second + 10*time.Millisecond)) })
	second := NewMetrics(prometheus.NewRegistry())
	start("replica-1", second, time.Millisecond)
	stopFirst() // released on cancel: the second takes over within its retry period
	kubetest.WaitFor(t, 20*time.Second, "replica-1 to lead", func() bool { return testutil.ToFloat64(second.Leader) == 1 })
	write()
	// Its informer lists the two older Events before it watches this one.
	kubetest.WaitFor(t, 10*time.Second, "replica-1 to count the Event after its start", func() bool { return drained(second) >= 1 })
	if got := drained(second); got != 1 {
		t.Errorf("replica-1 counted %v handovers, want 1: the two before its window are its predecessor's", got)
	}
	if got := drained(first) + drained(second); got != 3 {
		t.Errorf("the replicas counted %v handovers in all, want 3, each once", got)
	}
	if testutil.ToFloat64(first.Leader) != 0 {
		t.Error("replica-0 still says it leads after it stopped")
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
