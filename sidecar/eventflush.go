package sidecar

import (
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
)

// EventFlush lets an exiting sidecar wait for its last Events only as long
// as they take to be written. It counts the Events recorded through its
// Recorder and those its Sink has finished with: written, or refused for
// good by the API (client-go's record package does not retry those either).
// The broadcaster (record.NewBroadcaster) writes Events asynchronously, one
// at a time, and its Shutdown cancels the writes under way; Wait before it.
//
// An Event the broadcaster drops (its queue full) or its correlator skips
// (the spam filter: more than 25 Events on the pod in a burst) is never
// written: Wait then ends at its bound.
type EventFlush struct {
	mu                sync.Mutex
	recorded, written int
	changed           chan struct{} // closed and replaced when written grows
}

// NewEventFlush returns an EventFlush with nothing recorded.
func NewEventFlush() *EventFlush { return &EventFlush{changed: make(chan struct{})} }

// Recorder wraps r: each Event recorded through it is counted.
func (f *EventFlush) Recorder(r record.EventRecorder) record.EventRecorder {
	return &countingRecorder{r: r, f: f}
}

// Sink wraps s, the broadcaster's sink (StartRecordingToSink): each Event it
// finishes with is counted.
func (f *EventFlush) Sink(s record.EventSink) record.EventSink { return &countingSink{s: s, f: f} }

// Wait returns true once every Event recorded so far is written, or false
// when bound passes first on clk.
func (f *EventFlush) Wait(clk clock.Clock, bound time.Duration) bool {
	timeout := clk.After(bound)
	for {
		f.mu.Lock()
		done, changed := f.written >= f.recorded, f.changed
		f.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-changed:
		case <-timeout:
			return false
		}
	}
}

func (f *EventFlush) record() {
	f.mu.Lock()
	f.recorded++
	f.mu.Unlock()
}

// finished counts a write that returned err, unless the broadcaster will
// try it again: a transport error, or a patch of an Event the API no longer
// has (then it creates it).
func (f *EventFlush) finished(err error, patch bool) {
	var construction *restclient.RequestConstructionError
	var status *apierrors.StatusError
	switch {
	case err == nil, errors.As(err, &construction):
	case errors.As(err, &status) && (!patch || !apierrors.IsNotFound(err)):
	default:
		return
	}
	f.mu.Lock()
	f.written++
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

type countingSink struct {
	s record.EventSink
	f *EventFlush
}

func (c *countingSink) Create(e *corev1.Event) (*corev1.Event, error) {
	out, err := c.s.Create(e)
	c.f.finished(err, false)
	return out, err
}

func (c *countingSink) Update(e *corev1.Event) (*corev1.Event, error) {
	out, err := c.s.Update(e)
	c.f.finished(err, false)
	return out, err
}

func (c *countingSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	out, err := c.s.Patch(e, data)
	c.f.finished(err, true)
	return out, err
}

type countingRecorder struct {
	r record.EventRecorder
	f *EventFlush
}

func (c *countingRecorder) Event(object runtime.Object, eventtype, reason, message string) {
	c.f.record()
	c.r.Event(object, eventtype, reason, message)
}

func (c *countingRecorder) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	c.f.record()
	c.r.Eventf(object, eventtype, reason, messageFmt, args...)
}

func (c *countingRecorder) AnnotatedEventf(object runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...any) {
	c.f.record()
	c.r.AnnotatedEventf(object, annotations, eventtype, reason, messageFmt, args...)
}
