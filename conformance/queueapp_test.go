package conformance_test

import (
	"context"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/conformance"
	"github.com/handoff-dev/handoff/worker"
)

// A handler that runs only after the worker is told to stop (its goroutine
// late on a loaded machine: its claim counted as started before it ran)
// waits for the work to be finished; Stop finishes it, so Run returns and
// Stop with it, within its context (seen once: a Restart waited out the
// suite's 3 minutes).
func TestQueueAppStopFinishesLateWork(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	late := make(chan struct{})
	app := &conformance.QueueApp{
		Start: func(_ context.Context, work func(context.Context, string) error) (*worker.Agent, func(context.Context) error, error) {
			a, err := worker.New(worker.Options{Token: token})
			if err != nil {
				return nil, nil, err
			}
			return a, func(ctx context.Context) error {
				<-ctx.Done()
				// The handler runs now, after the stop's finish.
				close(late)
				_ = work(context.Background(), "conformance-held-late")
				return ctx.Err()
			}, nil
		},
		Publish: func(context.Context, ...string) error { return nil },
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := app.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := app.Stop(ctx); err != nil {
		t.Fatalf("Stop with a handler started after it: %v after %s; want Run to return", err, time.Since(start).Round(time.Millisecond))
	}
	<-late
}
