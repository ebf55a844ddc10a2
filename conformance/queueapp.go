package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// QueueApp is a Fixture, CancelFixture and LeaderFixture (Leader) for a
// worker built on package worker and a real queue, such as one of the
// adapters (worker/jetstream, worker/redisstreams, worker/rabbitmq): the
// suite's claims are real messages, published to the queue and claimed,
// worked and handed back by the worker as in production. Serve it (it is an
// http.Handler: the current worker's Agent) and pass it as Target.Fixture.
//
// Restart stops the worker Start made last (Stop) and starts a fresh one
// on an empty queue; Hold publishes n messages whose work runs, ignoring
// cancellation, until Finish; HoldCancelable publishes n whose work ends at
// the cancel fallback with an error, unacknowledged, which the worker must
// hand back at its next return. Hold returns once the worker's Agent counts
// them started (in flight, not unstarted), bounded by ctx.
type QueueApp struct {
	// Start makes a fresh worker on an empty queue (a new stream, queue
	// or consumer group) and returns its Agent and its Run, which QueueApp
	// runs in a goroutine of its own until the next Restart or Stop
	// cancels its context; Run must then return. The worker's handler must
	// call work with each message's body and return work's error: nil
	// acknowledges the message, an error leaves it to the worker to hand
	// back. Required.
	Start func(ctx context.Context, work func(ctx context.Context, body string) error) (*worker.Agent, func(context.Context) error, error)
	// Publish puts messages with the bodies into the current worker's
	// queue. Required.
	Publish func(ctx context.Context, bodies ...string) error

	mu      sync.Mutex
	agent   *worker.Agent
	stop    context.CancelFunc // ends the current worker's Run
	done    chan error         // its result
	release chan struct{}      // closed by Finish (or Restart): held work ends
	n       int                // messages published, for unique bodies
	waiting int                // held work waiting for Finish (its handler has the release channel)
}

// cancelablePrefix marks the bodies of HoldCancelable's messages.
const cancelablePrefix = "conformance-cancelable-"

// Agent is the current worker's Agent; nil before the first Restart.
func (q *QueueApp) Agent() *worker.Agent {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.agent
}

// Leader is a LeaderFixture for the current worker (AgentLeader).
func (q *QueueApp) Leader() LeaderFixture { return AgentLeader(q.Agent) }

// ServeHTTP serves the current worker's Agent; 503 before the first
// Restart.
func (q *QueueApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a := q.Agent()
	if a == nil {
		http.Error(w, "no worker started", http.StatusServiceUnavailable)
		return
	}
	a.Handler().ServeHTTP(w, r)
}

// Restart implements Fixture.
func (q *QueueApp) Restart(ctx context.Context) error {
	if q.Start == nil || q.Publish == nil {
		return errors.New("conformance: QueueApp needs Start and Publish")
	}
	if err := q.Stop(ctx); err != nil {
		return fmt.Errorf("stop the worker: %w", err)
	}
	a, run, err := q.Start(ctx, q.work)
	if err != nil {
		return fmt.Errorf("start a worker: %w", err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(rctx) }()
	q.mu.Lock()
	q.agent, q.stop, q.done = a, stop, done
	q.mu.Unlock()
	return nil
}

// Stop ends the work under way and stops the current worker: it cancels
// its Run's context and waits, bounded by ctx, for Run to return; an error
// of Run other than the context's is returned. Without a worker it does
// nothing.
func (q *QueueApp) Stop(ctx context.Context) error {
	q.mu.Lock()
	stop, done := q.stop, q.done
	q.stop, q.done = nil, nil
	q.finishLocked()
	q.mu.Unlock()
	if stop == nil {
		return nil
	}
	stop()
	// A handler that read the release channel only after the finish above
	// (its goroutine late to run on a loaded machine: the claim counts as
	// started before the handler runs) would wait for a Finish that never
	// comes, and Run with it: release such work until Run returns.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("Run: %w", err)
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			q.mu.Lock()
			q.finishLocked()
			q.mu.Unlock()
		}
	}
}

// work is the message handler QueueApp gives Start.
func (q *QueueApp) work(ctx context.Context, body string) error {
	if strings.HasPrefix(body, cancelablePrefix) {
		<-ctx.Done() // only the cancel fallback ends it: unacknowledged
		return context.Cause(ctx)
	}
	q.mu.Lock()
	release := q.release
	q.waiting++
	q.mu.Unlock()
	<-release // ignores ctx: runs until Finish
	q.mu.Lock()
	q.waiting--
	q.mu.Unlock()
	return nil
}

// Hold implements Fixture.
func (q *QueueApp) Hold(ctx context.Context, n int) error { return q.hold(ctx, "conformance-held-", n) }

// HoldCancelable implements CancelFixture.
func (q *QueueApp) HoldCancelable(ctx context.Context, n int) error {
	return q.hold(ctx, cancelablePrefix, n)
}

func (q *QueueApp) hold(ctx context.Context, prefix string, n int) error {
	q.mu.Lock()
	a := q.agent
	if a == nil {
		q.mu.Unlock()
		return errors.New("conformance: QueueApp.Hold before Restart")
	}
	if q.release == nil {
		q.release = make(chan struct{})
	}
	want, wantWaiting := started(a)+n, q.waiting+n
	bodies := make([]string, n)
	for i := range bodies {
		q.n++
		bodies[i] = fmt.Sprintf("%s%d", prefix, q.n)
	}
	q.mu.Unlock()
	if err := q.Publish(ctx, bodies...); err != nil {
		return fmt.Errorf("publish %d messages: %w", n, err)
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	// Held once the work itself waits for Finish: a claim counts as
	// started before its handler runs, and a Finish in between would leave
	// that handler waiting for the next one.
	waiting := func() bool {
		if prefix == cancelablePrefix {
			return true // its work waits for the cancel, not for Finish
		}
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.waiting >= wantWaiting
	}
	for started(a) < want || !waiting() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the worker works on %d of the %d messages published: %w", started(a)-(want-n), n, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// started is how many claims a holds that it has started.
func started(a *worker.Agent) int { return a.InFlight() - a.Unstarted() }

// Finish implements Fixture.
func (q *QueueApp) Finish(context.Context) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.finishLocked()
	return nil
}

// finishLocked ends the work under way; work that starts later waits for
// the next Finish.
func (q *QueueApp) finishLocked() {
	if q.release != nil {
		close(q.release)
	}
	q.release = make(chan struct{})
}

// TestQueueApp is a Go test of app: it serves app on a Unix socket, as an
// injected worker serves (protocol.AppSocket's transport), runs every case
// against it with the pod's token token (within 3 minutes), stops the last
// worker, logs the report, and fails t unless every case passed but those
// of the group "unstarted" (stop-claiming/hands-back-unstarted-at-once),
// skipped: a QueueApp cannot make an adapter hold claims unstarted on cue (how many it prefetches is the adapter's own
// business), so each adapter's own tests check that hand-back on its
// queue.
func TestQueueApp(t testing.TB, app *QueueApp, token string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "qa") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	e := protocol.Endpoint{Network: "unix", Address: filepath.Join(dir, "app.sock")}
	ln, err := e.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: app, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	rep := Run(ctx, Target{URL: e.String(), Token: token, Fixture: app, Leader: app.Leader(), Logf: t.Logf})
	if err := app.Stop(ctx); err != nil {
		t.Errorf("stopping the last worker: %v", err)
	}
	unstarted := ids(casesOf("unstarted"))
	skipped := 0
	for _, id := range unstarted {
		if c, _ := rep.Case(id); c.Result == Skip {
			skipped++
		}
	}
	if rep.Count(Pass) != len(Cases())-len(unstarted) || skipped != len(unstarted) {
		t.Fatalf("%d of %d cases passed, want all but %s (skipped):\n%s", rep.Count(Pass), len(Cases()), strings.Join(unstarted, ", "), rep)
	}
	t.Logf("\n%s", rep)
}
