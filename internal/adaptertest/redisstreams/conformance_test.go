package redisstreams_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/handoff-dev/handoff/conformance"
	"github.com/handoff-dev/handoff/internal/redistest"
	"github.com/handoff-dev/handoff/worker"
	"github.com/handoff-dev/handoff/worker/redisstreams"
)

// conformanceToken is the pod's token the suite sends.
const conformanceToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// The adapter passes every case of the app side's conformance suite, its
// claims real entries on a real redis-server: each fresh worker reads its
// own stream through its own consumer group.
func TestConformance(t *testing.T) {
	rdb := redistest.Client(t)
	var stream string
	app := &conformance.QueueApp{
		Start: func(_ context.Context, work func(context.Context, string) error) (*worker.Agent, func(context.Context) error, error) {
			stream = redistest.Key(t)
			a, err := redisstreams.New(worker.Options{Token: conformanceToken}, rdb,
				redisstreams.Config{Stream: stream, Group: group, Consumer: "c", Batch: 1, Concurrency: 8})
			if err != nil {
				return nil, nil, err
			}
			return a.Agent(), func(ctx context.Context) error {
				return a.Run(ctx, func(ctx context.Context, m redis.XMessage) error { return work(ctx, fmt.Sprint(m.Values["body"])) })
			}, nil
		},
		Publish: func(ctx context.Context, bodies ...string) error {
			for _, b := range bodies {
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"body", b}}).Err(); err != nil {
					return err
				}
			}
			return nil
		},
	}
	conformance.TestQueueApp(t, app, conformanceToken)
}
