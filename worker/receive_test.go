package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"sync"

	"github.com/handoff-dev/handoff/worker"
)

// A pending receive holds no claim: it is counted apart from the claims in
// flight, and stop-claiming ends its context before it answers.
func TestReceiveIsNotInFlightAndEndsAtStopClaiming(t *testing.T) {
	a := newAgent(t, worker.Options{})
	app := serve(t, a)
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st, err := app.Drain(context.Background(), 0)
	if err != nil || st.InFlight != 0 || st.Receiving != 1 || st.Drained {
		t.Fatalf("drain while receiving = %+v, %v: want 0 in flight, 1 receiving, not drained", st, err)
	}
	if a.InFlight() != 0 {
		t.Fatalf("InFlight = %d while only receiving, want 0", a.InFlight())
	}
	st, err = app.StopClaiming(context.Background())
	if err != nil || !st.Stopping || st.InFlight != 0 {
		t.Fatalf("stop-claiming = %+v, %v", st, err)
	}
	// Ended by the time stop-claiming answered, not some time later.
	if err := r.Context().Err(); err == nil {
		t.Fatal("the receive's context did not end at stop-claiming")
	}
	if cause := context.Cause(r.Context()); !errors.Is(cause, worker.ErrStopping) {
		t.Fatalf("cause = %v, want ErrStopping", cause)
	}
	if _, err := a.Receive(context.Background()); !errors.Is(err, worker.ErrStopping) {
		t.Fatalf("Receive after stop-claiming = %v, want ErrStopping", err)
	}
	r.End()
	r.End() // idempotent
	st, err = app.Drain(context.Background(), 0)
	if err != nil || !st.Drained || st.Receiving != 0 {
		t.Fatalf("drain after the receive ended = %+v, %v: want drained", st, err)
	}
}

// The pattern of a worker idle in a long poll: the sidecar's drain long
// poll sees it drained as soon as stop-claiming ends the wait, not at its
// wait's end.
func TestIdleLongPollIsDrainedOnceStopClaimingEndsIt(t *testing.T) {
	a := newAgent(t, worker.Options{})
	app := serve(t, a)
	waiting := make(chan struct{})
	go func() {
		r, err := a.Receive(context.Background())
		if err != nil {
			t.Error(err)
			return
		}
		close(waiting)
		select { // a long poll with nothing to receive
		case <-r.Context().Done():
		case <-time.After(time.Hour):
		}
		r.End()
	}()
	<-waiting
	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := app.Drain(context.Background(), 30*time.Second)
	if err != nil || !st.Drained {
		t.Fatalf("drain = %+v, %v: want drained once the long poll ended", st, err)
	}
}

// A message received in the race with stop-claiming is held: the drain
// waits for it, the return fallback hands it back, and its context is not
// ended by stop-claiming (the work goes on).
func TestMessageReceivedInTheRaceWithStopClaimingIsHeld(t *testing.T) {
	var inFlightAtReturn int
	var a *worker.Agent
	a = newAgent(t, worker.Options{ReturnClaims: func(context.Context) (int, error) {
		inFlightAtReturn = a.InFlight()
		return inFlightAtReturn, nil
	}})
	app := serve(t, a)
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := r.Hold() // the long poll had the message already
	r.End()
	if err := c.Context().Err(); err != nil {
		t.Fatalf("a held claim's context ended with stop-claiming: %v", err)
	}
	st, err := app.Drain(context.Background(), 10*time.Millisecond)
	if err != nil || st.Drained || st.InFlight != 1 || st.Receiving != 0 {
		t.Fatalf("drain = %+v, %v: want the claim held in the race in flight", st, err)
	}
	res, err := app.Return(context.Background(), false, 0)
	if err != nil || res.Returned != 1 || inFlightAtReturn != 1 {
		t.Fatalf("return = %+v, %v (in flight then %d): want the claim handed back", res, err, inFlightAtReturn)
	}
	c.Done()
	c.Done() // idempotent
	if err := c.Context().Err(); err == nil {
		t.Error("a claim's context goes on after Done")
	}
	if st, err := app.Drain(context.Background(), 0); err != nil || !st.Drained {
		t.Fatalf("drain after Done = %+v, %v", st, err)
	}
}

// A receive that gets several messages (a batch) holds each; the drain
// counts them all.
func TestBatchReceiveHoldsEachMessage(t *testing.T) {
	a := newAgent(t, worker.Options{})
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	claims := []*worker.Claim{r.Hold(), r.Hold(), r.Hold()}
	r.End()
	if n := a.InFlight(); n != 3 {
		t.Fatalf("InFlight = %d, want 3", n)
	}
	for _, c := range claims {
		c.Done()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.WaitDrained(ctx); err != nil {
		t.Fatalf("WaitDrained = %v after every claim was done", err)
	}
}

// The cancel fallback ends held claims' contexts with ErrCanceled.
func TestCancelFallbackEndsClaimsWithErrCanceled(t *testing.T) {
	a := newAgent(t, worker.Options{})
	app := serve(t, a)
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := r.Hold()
	r.End()
	go func() { <-c.Context().Done(); c.Done() }()
	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := app.Return(context.Background(), true, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(c.Context()); !errors.Is(cause, worker.ErrCanceled) {
		t.Fatalf("cause = %v, want ErrCanceled", cause)
	}
	if n := a.InFlight(); n != 0 {
		t.Fatalf("InFlight = %d after the canceled claim was done", n)
	}
}

func TestReceiveRefusesAnEndedContext(t *testing.T) {
	a := newAgent(t, worker.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Receive(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive(ended ctx) = %v, want context.Canceled", err)
	}
	if err := a.WaitDrained(context.Background()); err != nil {
		t.Fatalf("a refused Receive left something pending: %v", err)
	}
}

// Misuse and races of Receive/Hold/End/Claim under the race detector: Hold
// after End, End twice, Done twice, End before any Hold, and StopClaiming
// racing Receive, Hold and End. Whatever the interleaving, once every claim
// is Done and every receive ended the worker is drained, InFlight is 0, and
// a receive begun before stop-claiming has its Context ended with cause
// ErrStopping (or Canceled, if it was ended first).
func TestReceiveMisuseAndRacesEndDrained(t *testing.T) {
	for i := 0; i < 200; i++ {
		a := newAgent(t, worker.Options{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var claims []*worker.Claim
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					r, err := a.Receive(context.Background())
					if errors.Is(err, worker.ErrStopping) {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					c1 := r.Hold()
					r.End()
					r.End()
					c2 := r.Hold() // after End: still counted
					c1.Done()
					c1.Done()
					mu.Lock()
					claims = append(claims, c2)
					mu.Unlock()
					select {
					case <-r.Context().Done():
					default:
						t.Error("Context not ended after End")
					}
				}
			}()
		}
		pending, err := a.Receive(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%5) * 10 * time.Microsecond)
		a.StopClaiming()
		if c := context.Cause(pending.Context()); !errors.Is(c, worker.ErrStopping) {
			t.Fatalf("pending receive's cause %v, want ErrStopping", c)
		}
		late := pending.Hold() // a message received in the race with stop-claiming
		pending.End()
		wg.Wait()
		if _, _, err := a.Begin(context.Background()); !errors.Is(err, worker.ErrStopping) {
			t.Fatalf("Begin after StopClaiming: %v", err)
		}
		if _, err := a.Receive(context.Background()); !errors.Is(err, worker.ErrStopping) {
			t.Fatalf("Receive after StopClaiming: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		if a.WaitDrained(ctx) == nil {
			t.Fatal("drained with claims held")
		}
		cancel()
		late.Done()
		for _, c := range claims {
			c.Done()
			c.Done()
		}
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		if err := a.WaitDrained(ctx); err != nil || a.InFlight() != 0 {
			t.Fatalf("after every Done: drained %v, in flight %d", err, a.InFlight())
		}
		cancel()
	}
}

// The cancel fallback ends the Context of claims held, with cause
// ErrCanceled, including one held after End and one held after
// stop-claiming; claims Done before are untouched.
func TestCancelFallbackReachesClaimsHeldLate(t *testing.T) {
	a := newAgent(t, worker.Options{})
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	early := r.Hold()
	r.End()
	afterEnd := r.Hold()
	a.StopClaiming()
	afterStop := r.Hold()
	early.Done()
	go func() {
		time.Sleep(20 * time.Millisecond)
		afterEnd.Done()
		afterStop.Done()
	}()
	if _, err := a.Return(context.Background(), true, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*worker.Claim{"after End": afterEnd, "after stop-claiming": afterStop} {
		if cause := context.Cause(c.Context()); !errors.Is(cause, worker.ErrCanceled) {
			t.Errorf("claim held %s: cause %v", name, cause)
		}
	}
	if a.InFlight() != 0 {
		t.Errorf("in flight %d after the cancel fallback", a.InFlight())
	}
}
