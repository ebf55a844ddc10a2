package sidecar_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/sidecar"
)

// The exit's wait for the last Events ends once they are written, not at
// its bound; after it and the broadcaster's Shutdown, as at the sidecar's
// exit, they are in the API.
func TestEventFlushEndsWhenTheEventsAreWritten(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	pod := env.Pod(t, ns, "pod-a", 30)
	flush := sidecar.NewEventFlush()
	b := record.NewBroadcaster()
	b.StartRecordingToSink(flush.Sink(&typedcorev1.EventSinkImpl{Interface: env.Client.CoreV1().Events(ns)}))
	rec := flush.Recorder(b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "handoff"}))
	for _, reason := range []string{sidecar.ReasonDrainStarted, sidecar.ReasonDrained, sidecar.ReasonLeaseReleased} {
		rec.Eventf(pod, corev1.EventTypeNormal, reason, "the last Events of a sequence")
	}
	// The fake clock never moves: Wait can only end by the Events.
	clk := clocktesting.NewFakeClock(time.Now())
	done := make(chan bool, 1)
	go func() { done <- flush.Wait(clk, time.Second) }()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("Wait said the bound passed; the clock never moved")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not end with the Events written")
	}
	b.Shutdown()
	list, err := env.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=pod-a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 3 {
		t.Errorf("%d Events in the API after the flush and Shutdown, want 3", len(list.Items))
	}
}

// Events that cannot be written end the wait at its bound.
func TestEventFlushEndsAtItsBound(t *testing.T) {
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	down.Close() // every write is a transport error, retried
	kube := kubernetes.NewForConfigOrDie(&rest.Config{Host: down.URL})
	flush := sidecar.NewEventFlush()
	b := record.NewBroadcaster()
	defer b.Shutdown()
	b.StartRecordingToSink(flush.Sink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("ns")}))
	rec := flush.Recorder(b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "handoff"}))
	rec.Eventf(&corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "ns", Name: "pod-a"}, corev1.EventTypeNormal, sidecar.ReasonDrained, "lost")
	clk := clocktesting.NewFakeClock(time.Now())
	done := make(chan bool, 1)
	go func() { done <- flush.Wait(clk, time.Second) }()
	kubetest.WaitFor(t, 5*time.Second, "Wait to wait on the clock", clk.HasWaiters)
	select {
	case <-done:
		t.Fatal("Wait ended before its bound with the Event unwritten")
	default:
	}
	clk.Step(time.Second)
	if <-done {
		t.Error("Wait said the Event was written")
	}
}
