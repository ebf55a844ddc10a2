package jetstream_test

import (
	"context"
	"errors"
	"fmt"
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
	conformance.TestQueueApp(t, app, conformanceToken)
}
