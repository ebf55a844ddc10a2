package jetstream_test

import (
	"context"
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
	var q *queue
	app := &conformance.QueueApp{
		Start: func(_ context.Context, work func(context.Context, string) error) (*worker.Agent, func(context.Context) error, error) {
			q = newQueue(t, time.Hour)
			nc, c := q.consumer()
			w, err := jetstream.New(worker.Options{Token: conformanceToken}, nc, c, jetstream.Config{Concurrency: 8})
			if err != nil {
				return nil, nil, err
			}
			return w.Agent(), func(ctx context.Context) error {
				return w.Run(ctx, func(ctx context.Context, m js.Msg) error { return work(ctx, string(m.Data())) })
			}, nil
		},
		Publish: func(_ context.Context, bodies ...string) error { q.publish(bodies...); return nil },
	}
	conformance.TestQueueApp(t, app, conformanceToken)
}
