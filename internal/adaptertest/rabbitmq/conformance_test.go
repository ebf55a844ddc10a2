package rabbitmq_test

import (
	"context"
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
	var (
		conn  *amqp.Connection
		queue string
	)
	app := &conformance.QueueApp{
		Start: func(_ context.Context, work func(context.Context, string) error) (*worker.Agent, func(context.Context) error, error) {
			// Each worker on a connection of its own, as a worker process has:
			// channels of the worker stopped before must not share it.
			conn = rabbittest.Conn(t)
			queue = rabbittest.Queue(t, conn)
			a, err := rabbitmq.New(worker.Options{Token: conformanceToken}, conn, rabbitmq.Config{Queue: queue, Concurrency: 8})
			if err != nil {
				return nil, nil, err
			}
			return a.Agent(), func(ctx context.Context) error {
				return a.Run(ctx, func(ctx context.Context, d amqp.Delivery) error { return work(ctx, string(d.Body)) })
			}, nil
		},
		Publish: func(_ context.Context, bodies ...string) error { publish(t, conn, queue, bodies...); return nil },
	}
	conformance.TestQueueApp(t, app, conformanceToken)
}
