package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	js "github.com/nats-io/nats.go/jetstream"

	"github.com/handoff-dev/handoff/conformance"
	"github.com/handoff-dev/handoff/worker"
	"github.com/handoff-dev/handoff/worker/jetstream"
)

// conformanceToken is the pod's token the suite sends.
const conformanceToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// jsApp is a JetStream worker (this package's adapter on a real
// nats-server) as the conformance suite's fixture: each Restart starts a
// new worker process's equivalent on a fresh stream and consumer; Hold
// publishes messages whose work runs until Finish; HoldCancelable
// publishes messages whose work ends at the cancel fallback, unacked (the
// adapter Naks them).
type jsApp struct {
	t       *testing.T
	mu      sync.Mutex
	w       *jetstream.Worker
	q       *queue
	stop    context.CancelFunc
	done    chan error
	release chan struct{} // closed by Finish: the work Hold started ends
	n       int           // messages published, for their bodies
}

func (a *jsApp) agent() *worker.Agent {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.w.Agent()
}

func (a *jsApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.agent().Handler().ServeHTTP(w, r)
}

func (a *jsApp) Restart(ctx context.Context) error {
	a.mu.Lock()
	stop, done := a.stop, a.done
	if a.release != nil {
		close(a.release)
	}
	a.mu.Unlock()
	if stop != nil {
		stop()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("the old worker's Run: %w", err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	q := newQueue(a.t, time.Hour)
	nc, c := q.consumer()
	w, err := jetstream.New(worker.Options{Token: conformanceToken}, nc, c, jetstream.Config{Concurrency: 8})
	if err != nil {
		return err
	}
	release := make(chan struct{})
	runCtx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() {
		done <- w.Run(runCtx, func(ctx context.Context, m js.Msg) error {
			if strings.HasPrefix(string(m.Data()), "cancelable") {
				<-ctx.Done() // the cancel fallback: the adapter Naks it
				return context.Cause(ctx)
			}
			<-a.releaseOf(release) // the work ignores its context: it runs until Finish
			return nil
		})
	}()
	a.mu.Lock()
	a.w, a.q, a.stop, a.done, a.release = w, q, cancel, done, release
	a.mu.Unlock()
	return nil
}

// releaseOf is the channel that ends work starting now: the current one,
// or gen's once a Restart has replaced the worker gen belongs to.
func (a *jsApp) releaseOf(gen chan struct{}) chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.release == nil {
		return gen
	}
	return a.release
}

func (a *jsApp) Hold(ctx context.Context, n int) error { return a.hold(ctx, "held", n) }

func (a *jsApp) HoldCancelable(ctx context.Context, n int) error {
	return a.hold(ctx, "cancelable", n)
}

// hold publishes n messages with bodies kind-i and waits until the worker
// works on all of them.
func (a *jsApp) hold(ctx context.Context, kind string, n int) error {
	a.mu.Lock()
	q, ag := a.q, a.w.Agent()
	want := ag.InFlight() + n
	var ids []string
	for range n {
		a.n++
		ids = append(ids, fmt.Sprintf("%s-%d", kind, a.n))
	}
	a.mu.Unlock()
	q.publish(ids...)
	for ag.InFlight()-ag.Unstarted() < want {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

func (a *jsApp) Finish(context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	close(a.release)
	a.release = make(chan struct{})
	// Work under way waits on the old channel, now closed; work that
	// starts from now on waits on the new one.
	return nil
}

// The adapter passes every case of the app side's conformance suite, on a
// real nats-server.
func TestConformance(t *testing.T) {
	app := &jsApp{t: t}
	if err := app.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		app.mu.Lock()
		stop, done := app.stop, app.done
		close(app.release)
		app.release = nil
		app.mu.Unlock()
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep := conformance.Run(ctx, conformance.Target{
		URL: srv.URL, Token: conformanceToken, Fixture: app, Leader: conformance.AgentLeader(app.agent),
		Client: srv.Client(), Logf: t.Logf,
	})
	t.Logf("\n%s", rep)
	if rep.Count(conformance.Pass) != len(conformance.Cases()) {
		t.Fatalf("%d of %d cases passed:\n%s", rep.Count(conformance.Pass), len(conformance.Cases()), rep)
	}
}
