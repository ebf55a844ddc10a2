package sidecar_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/handoff-dev/handoff/internal/outcome"
	"github.com/handoff-dev/handoff/sidecar"
)

// A pod's ShutdownFinished Events are neither combined into one (which
// would drop their summaries) nor throttled with the pod's other Events,
// while the correlator keeps its defaults for the others.
func TestCorrelatorKeepsEveryShutdownSummary(t *testing.T) {
	c := record.NewEventCorrelatorWithOptions(sidecar.CorrelatorOptions())
	pod := corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "worker-0", UID: "u1", APIVersion: "v1"}
	at := metav1.NewTime(time.Now())
	event := func(reason, message string) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("worker-0.%d", time.Now().UnixNano()), Namespace: "ns", Annotations: map[string]string{outcome.Annotation: message}},
			InvolvedObject: pod, Reason: reason, Message: message, Type: corev1.EventTypeNormal,
			Source: corev1.EventSource{Component: "handoff"}, FirstTimestamp: at, LastTimestamp: at, Count: 1,
		}
	}
	// 30 Lease acquisitions (shards) use up the pod's burst of 25.
	skipped := 0
	for i := range 30 {
		r, err := c.EventCorrelate(event(sidecar.ReasonLeaseAcquired, fmt.Sprintf("Lease shard-%d acquired", i)))
		if err != nil {
			t.Fatal(err)
		}
		if r.Skip {
			skipped++
		}
	}
	if skipped != 5 {
		t.Errorf("%d of 30 LeaseAcquired Events skipped, want 5 (client-go's default burst of 25)", skipped)
	}
	// Then 20 sequences (a worker that restarts): each its own Event, with its summary.
	for i := range 20 {
		r, err := c.EventCorrelate(event(sidecar.ReasonShutdownFinished, fmt.Sprintf("Shutdown finished: Drained (trigger preStop at %d)", i)))
		if err != nil {
			t.Fatal(err)
		}
		if r.Skip || strings.HasPrefix(r.Event.Message, "(combined") || r.Event.Annotations[outcome.Annotation] == "" || r.Event.Count != 1 {
			t.Fatalf("sequence %d: skipped %t, Event %q count %d annotations %v: want its own Event with its summary", i, r.Skip, r.Event.Message, r.Event.Count, r.Event.Annotations)
		}
	}
}
