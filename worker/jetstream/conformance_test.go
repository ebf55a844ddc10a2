package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	js "github.com/nats-io/nats.go/jetstream"

	"github.com/handoff-dev/handoff/conformance"
	"github.com/handoff-dev/handoff/worker"
	"github.com/handoff-dev/handoff/worker/jetstream"
)

// conformanceToken is the pod's token the suite sends.
const conformanceToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// The adapter passes every case of the app side's conformance suite, its
// claims real messages on a real nats-server: each fresh worker has its own
// stream and durable consumer.
func TestConformance(t *testing.T) {
	var (
		q    *queue
		stop context.CancelFunc
		done chan error
	)
	app := &conformance.QueueApp{
		Start: func(_ context.Context, work func(context.Context, string) error) (*worker.Agent, error) {
			q = newQueue(t, time.Hour)
			nc, c := q.consumer()
			w, err := jetstream.New(worker.Options{Token: conformanceToken}, nc, c, jetstream.Config{Concurrency: 8})
			if err != nil {
				return nil, err
			}
			var ctx context.Context
			ctx, stop = context.WithCancel(context.Background())
			done = make(chan error, 1)
			go func() {
				done <- w.Run(ctx, func(ctx context.Context, m js.Msg) error { return work(ctx, string(m.Data())) })
			}()
			return w.Agent(), nil
		},
		Stop: func(ctx context.Context) error {
			stop()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					return fmt.Errorf("Run: %w", err)
				}
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
		Publish: func(_ context.Context, bodies ...string) error { q.publish(bodies...); return nil },
	}
	runConformance(t, app)
}

// runConformance runs the suite against app, served by httptest, and
// fails t unless every case passed; it stops app's worker at the end.
func runConformance(t *testing.T, app *conformance.QueueApp) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := httptest.NewServer(app)
	defer srv.Close()
	rep := conformance.Run(ctx, conformance.Target{
		URL: srv.URL, Token: conformanceToken, Fixture: app, Leader: app.Leader(), Client: srv.Client(), Logf: t.Logf,
	})
	if err := app.Finish(ctx); err == nil && app.Agent() != nil {
		if err := app.Stop(ctx); err != nil {
			t.Errorf("stopping the last worker: %v", err)
		}
	}
	if rep.Count(conformance.Pass) != len(conformance.Cases()) {
		t.Fatalf("%d of %d cases passed:\n%s", rep.Count(conformance.Pass), len(conformance.Cases()), rep)
	}
	t.Logf("\n%s", rep)
}
