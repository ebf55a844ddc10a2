package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/handoff-dev/handoff/conformance"
	"github.com/handoff-dev/handoff/internal/rabbittest"
	"github.com/handoff-dev/handoff/worker"
	"github.com/handoff-dev/handoff/worker/rabbitmq"
)

// conformanceToken is the pod's token the suite sends.
const conformanceToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// The adapter passes every case of the app side's conformance suite, its
// claims real deliveries on a real RabbitMQ node: each fresh worker
// consumes its own queue.
func TestConformance(t *testing.T) {
	conn := rabbittest.Conn(t)
	var (
		queue string
		stop  context.CancelFunc
		done  chan error
	)
	app := &conformance.QueueApp{
		Start: func(_ context.Context, work func(context.Context, string) error) (*worker.Agent, error) {
			queue = rabbittest.Queue(t, conn)
			a, err := rabbitmq.New(worker.Options{Token: conformanceToken}, conn, rabbitmq.Config{Queue: queue, Concurrency: 8})
			if err != nil {
				return nil, err
			}
			var ctx context.Context
			ctx, stop = context.WithCancel(context.Background())
			done = make(chan error, 1)
			go func() {
				done <- a.Run(ctx, func(ctx context.Context, d amqp.Delivery) error { return work(ctx, string(d.Body)) })
			}()
			return a.Agent(), nil
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
		Publish: func(_ context.Context, bodies ...string) error { publish(t, conn, queue, bodies...); return nil },
	}
	conformance.TestQueueApp(t, app, conformanceToken)
}
