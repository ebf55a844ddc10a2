package worker_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/worker"
)

// visQueue is a queue with a visibility timeout, as one worker sees it: a
// message received is claimed by the worker, invisible to others, until it
// is deleted (finished) or handed back (made visible again); the timeout
// itself, which would give it back an hour later, never comes in a test.
type visQueue struct {
	t       *testing.T
	mu      sync.Mutex
	visible []string
	claimed map[string]bool
	changed chan struct{} // closed and replaced at each change

	running atomic.Int32 // ReturnClaims calls under way
	calls   atomic.Int32 // ReturnClaims calls made
	// hook, when set, runs in ReturnClaims after it has handed back what
	// it found claimed (the call's view of the queue is taken), before it
	// returns.
	hook func()
	// gate, when set, runs first in ReturnClaims, before it looks at the
	// queue, with the call's number (1 for the first call).
	gate func(call int32)
}

func newVisQueue(t *testing.T) *visQueue {
	return &visQueue{t: t, claimed: map[string]bool{}, changed: make(chan struct{})}
}

func (q *visQueue) changedLocked() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// put enqueues a visible message.
func (q *visQueue) put(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.visible = append(q.visible, id)
	q.changedLocked()
}

// receive waits for a visible message and claims it (a long poll).
func (q *visQueue) receive(ctx context.Context) (string, error) {
	for {
		q.mu.Lock()
		if len(q.visible) > 0 {
			id := q.visible[0]
			q.visible = q.visible[1:]
			q.claimed[id] = true
			q.changedLocked()
			q.mu.Unlock()
			return id, nil
		}
		changed := q.changed
		q.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// returnClaims is Options.ReturnClaims: every message claimed is made
// visible again.
func (q *visQueue) returnClaims(context.Context) (int, error) {
	if q.running.Add(1) > 1 {
		q.t.Error("ReturnClaims called while another call runs")
	}
	defer q.running.Add(-1)
	call := q.calls.Add(1)
	if q.gate != nil {
		q.gate(call)
	}
	q.mu.Lock()
	n := 0
	for id := range q.claimed {
		delete(q.claimed, id)
		q.visible = append(q.visible, id)
		n++
	}
	q.changedLocked()
	q.mu.Unlock()
	if q.hook != nil {
		q.hook()
	}
	return n, nil
}

// isVisible says whether id is visible now: handed back, free for another
// worker.
func (q *visQueue) isVisible(id string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Contains(q.visible, id)
}

// waitVisible waits until every one of ids is visible again: handed back,
// free for another worker. It fails t if they are not within a bound far
// beyond a hand-back's time.
func (q *visQueue) waitVisible(t *testing.T, ids ...string) {
	t.Helper()
	bound := time.After(10 * time.Second)
	for {
		q.mu.Lock()
		missing := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return slices.Contains(q.visible, id) })
		claimed := len(q.claimed)
		changed := q.changed
		q.mu.Unlock()
		if len(missing) == 0 {
			return
		}
		select {
		case <-changed:
		case <-bound:
			t.Fatalf("%v not handed back (%d messages still claimed by the worker, to wait for their visibility timeout)", missing, claimed)
		}
	}
}

// beginWorker is one turn of a claim loop that waits for its message
// inside Agent.Begin (the wait is in flight): it begins, says so on begun,
// receives one message, and, claiming having stopped meanwhile, gives it
// up without finishing it (Done, not delete). It says which message on
// ended, once done has been called.
func beginWorker(t *testing.T, a *worker.Agent, q *visQueue, begun chan<- struct{}, ended chan<- string) {
	ctx, done, err := a.Begin(context.Background())
	if err != nil {
		t.Error(err)
		begun <- struct{}{}
		return
	}
	begun <- struct{}{}
	id, err := q.receive(ctx)
	if err != nil {
		t.Error(err)
	}
	<-a.Stopping() // stopping: do not start it
	done()
	ended <- id
}

// A worker waiting for its message inside Begin at the drain deadline gets
// it after the return fallback's ReturnClaims ran, and gives it up (Done
// without finishing): the message is handed back then, not left claimed
// until its visibility timeout. Failed so before: ReturnClaims ran once,
// when nothing was claimed.
func TestClaimEndedAfterReturnIsHandedBack(t *testing.T) {
	q := newVisQueue(t)
	a := newAgent(t, worker.Options{ReturnClaims: q.returnClaims})
	app := serve(t, a)
	begun, ended := make(chan struct{}, 1), make(chan string, 1)
	go beginWorker(t, a, q, begun, ended)
	<-begun
	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := app.Drain(context.Background(), 0)
	if err != nil || st.InFlight != 1 {
		t.Fatalf("drain = %+v, %v: want the wait inside Begin in flight", st, err)
	}
	res, err := app.Return(context.Background(), false, 0)
	if err != nil || res.Returned != 0 {
		t.Fatalf("return = %+v, %v: want 0 returned, nothing claimed yet", res, err)
	}
	q.put("m") // arrives after the hand-back, and the waiting worker claims it
	if id := <-ended; id != "m" {
		t.Fatalf("the worker got %q, want m", id)
	}
	q.waitVisible(t, "m")
	if err := a.WaitDrained(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// The same with Receive and Hold: the queue call runs on the ctx given to
// Receive (a claim that may commit after a cut-off, as Receive.Context
// advises), so it claims the message after the return fallback ran; the
// claim held after Return and given up is handed back too.
func TestClaimHeldAfterReturnIsHandedBack(t *testing.T) {
	q := newVisQueue(t)
	a := newAgent(t, worker.Options{ReturnClaims: q.returnClaims})
	app := serve(t, a)
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	received := make(chan string, 1)
	go func() {
		id, err := q.receive(context.Background()) // the ctx given to Receive
		if err != nil {
			t.Error(err)
		}
		received <- id
	}()
	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res, err := app.Return(context.Background(), false, 0); err != nil || res.Returned != 0 {
		t.Fatalf("return = %+v, %v: want 0 returned, nothing claimed yet", res, err)
	}
	q.put("m")
	id := <-received
	c := r.Hold() // never refused: the message is claimed in the queue
	r.End()
	if id != "m" || a.InFlight() != 1 {
		t.Fatalf("received %q, %d in flight: want m held", id, a.InFlight())
	}
	c.Done() // given up, not finished
	q.waitVisible(t, "m")
}

// A claim that ends while the deadline's ReturnClaims runs, after that call
// has looked at the queue, is not missed: ReturnClaims runs again once the
// first call has returned, never beside it, and claims ending meanwhile
// (two here) are covered by that one more call.
func TestClaimEndedDuringTheFirstReturnIsHandedBack(t *testing.T) {
	q := newVisQueue(t)
	looked, resume := make(chan struct{}), make(chan struct{})
	var first sync.Once
	q.hook = func() { first.Do(func() { close(looked); <-resume }) }
	a := newAgent(t, worker.Options{ReturnClaims: q.returnClaims})
	app := serve(t, a)
	begun, ended := make(chan struct{}, 2), make(chan string, 2)
	for range 2 {
		go beginWorker(t, a, q, begun, ended)
		<-begun
	}
	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	returned := make(chan error, 1)
	go func() {
		res, err := app.Return(context.Background(), false, 0)
		if err == nil && res.Returned != 0 {
			err = errors.New("returned messages not yet claimed")
		}
		returned <- err
	}()
	<-looked // the first call found nothing claimed
	q.put("m1")
	q.put("m2")
	<-ended
	<-ended // both given up while the first call has not returned
	close(resume)
	if err := <-returned; err != nil {
		t.Fatalf("return: %v", err)
	}
	q.waitVisible(t, "m1", "m2")
	// One call more, not one per claim: a second Return (the sidecar's
	// repeat) runs after it, and is the third call.
	if _, err := app.Return(context.Background(), false, 0); err != nil {
		t.Fatal(err)
	}
	if n := q.calls.Load(); n != 3 {
		t.Errorf("ReturnClaims called %d times, want 3: the deadline's, one for the two claims that ended during it, the repeated Return's", n)
	}
}

// The fallback stops claiming, should stop-claiming never have reached the
// app: a worker must claim nothing after the hand-back.
func TestReturnStopsClaiming(t *testing.T) {
	q := newVisQueue(t)
	a := newAgent(t, worker.Options{ReturnClaims: q.returnClaims})
	app := serve(t, a)
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.Return(context.Background(), false, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Stopping():
	default:
		t.Fatal("Stopping not closed by the return fallback")
	}
	if cause := context.Cause(r.Context()); !errors.Is(cause, worker.ErrStopping) {
		t.Errorf("a pending receive's cause after the return fallback = %v, want ErrStopping", cause)
	}
	r.End()
	if _, _, err := a.Begin(context.Background()); !errors.Is(err, worker.ErrStopping) {
		t.Errorf("Begin after the return fallback = %v, want ErrStopping", err)
	}
	if _, err := a.Receive(context.Background()); !errors.Is(err, worker.ErrStopping) {
		t.Errorf("Receive after the return fallback = %v, want ErrStopping", err)
	}
}

// A worker that exits once WaitDrained returns leaves nothing claimed: a
// wait inside Begin claims its message just after the return fallback's
// hand-back and gives it up, and WaitDrained returns only once the
// hand-back that follows (ReturnClaims again) has returned. Failed so
// before: WaitDrained returned as soon as no claim was held, while that
// hand-back had yet to run, so the worker exited with m claimed until its
// visibility timeout (seen 10 of 10 times with a worker that exits when its
// loop ends).
func TestWaitDrainedWaitsForTheHandBackAfterReturn(t *testing.T) {
	q := newVisQueue(t)
	entered, resume := make(chan struct{}), make(chan struct{})
	q.gate = func(call int32) {
		if call == 2 { // the hand-back after the return fallback's
			close(entered)
			<-resume
		}
	}
	a := newAgent(t, worker.Options{ReturnClaims: q.returnClaims})
	app := serve(t, a)
	begun, ended := make(chan struct{}, 1), make(chan string, 1)
	go beginWorker(t, a, q, begun, ended)
	<-begun
	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res, err := app.Return(context.Background(), false, 0); err != nil || res.Returned != 0 {
		t.Fatalf("return = %+v, %v: want 0 returned, nothing claimed yet", res, err)
	}
	q.put("m") // lands just after the hand-back; the worker claims it and gives it up
	if id := <-ended; id != "m" {
		t.Fatalf("the worker got %q, want m", id)
	}
	<-entered // the hand-back of m is under way, and held there
	if a.InFlight() != 0 {
		t.Fatalf("%d claims held, want none: the worker is done with m", a.InFlight())
	}
	ended0, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.WaitDrained(ended0); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitDrained while the hand-back of m after the return fallback runs = %v, want ctx's error: a worker exiting now leaves m claimed until its visibility timeout", err)
	}
	close(resume)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.WaitDrained(ctx); err != nil {
		t.Fatalf("WaitDrained once the hand-back has returned = %v, want nil", err)
	}
	if !q.isVisible("m") {
		t.Fatal("WaitDrained returned with m still claimed: not handed back yet")
	}
}

// WaitDrained waits for a hand-back only within its bound: ReturnClaims
// stuck past the end of its ctx (here the sidecar gives up on its return
// call) ends the wait with ErrReturnOverdue rather than holding the
// worker's exit forever; the claims it did not hand back are left to their
// visibility timeout.
func TestWaitDrainedGivesUpOnAHandBackPastItsBound(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	a := newAgent(t, worker.Options{ReturnClaims: func(context.Context) (int, error) {
		if calls.Add(1) == 1 {
			close(entered)
			<-release // stuck, ignoring its ctx
		}
		return 0, nil
	}})
	app := serve(t, a)
	t.Cleanup(func() { close(release) }) // before serve's cleanup, which waits for the handler
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := r.Hold()
	r.End()
	rctx, giveUp := context.WithCancel(context.Background())
	returned := make(chan error, 1)
	go func() {
		_, err := app.Return(rctx, false, 0)
		returned <- err
	}()
	<-entered
	c.Done() // nothing held now; the hand-back under way has not returned
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.WaitDrained(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitDrained while the return fallback's hand-back runs = %v, want ctx's error", err)
	}
	giveUp() // the sidecar gives up on its return call: the call's bound has passed
	if err := <-returned; err == nil {
		t.Fatal("the return call given up on answered")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.WaitDrained(ctx); !errors.Is(err, worker.ErrReturnOverdue) {
		t.Fatalf("WaitDrained with the hand-back stuck past its bound = %v, want ErrReturnOverdue", err)
	}
}
