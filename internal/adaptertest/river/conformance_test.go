package river_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	riverqueue "github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/handoff-dev/handoff/conformance"
	"github.com/handoff-dev/handoff/worker"
	handoffriver "github.com/handoff-dev/handoff/worker/river"
)

// conformanceToken is the pod's token the suite sends.
const conformanceToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// bodyArgs is a job of the conformance suite: its body goes to the suite's
// work function.
type bodyArgs struct {
	Body string `json:"body"`
}

func (bodyArgs) Kind() string { return "conformance" }

type bodyWorker struct {
	riverqueue.WorkerDefaults[bodyArgs]
	work func(context.Context, string) error
}

func (w *bodyWorker) Work(ctx context.Context, j *riverqueue.Job[bodyArgs]) error {
	return w.work(ctx, j.Args.Body)
}

// The adapter passes every case of the app side's conformance suite, its
// claims real River jobs on a real PostgreSQL: each fresh worker has a
// database of its own.
func TestConformance(t *testing.T) {
	var e *env
	app := &conformance.QueueApp{
		Start: func(_ context.Context, work func(context.Context, string) error) (*worker.Agent, func(context.Context) error, error) {
			e = newEnv(t)
			workers := riverqueue.NewWorkers()
			riverqueue.AddWorker(workers, &bodyWorker{work: work})
			a, err := handoffriver.New(e.pool, &riverqueue.Config{
				Queues:            map[string]riverqueue.QueueConfig{riverqueue.QueueDefault: {MaxWorkers: 8}},
				Workers:           workers,
				FetchPollInterval: 5 * time.Second, // inserts are seen by River's notification
			}, worker.Options{Token: conformanceToken})
			if err != nil {
				return nil, nil, err
			}
			return a.Agent(), a.Run, nil
		},
		Publish: func(ctx context.Context, bodies ...string) error {
			c, err := riverqueue.NewClient[pgx.Tx](riverpgxv5.New(e.pool), &riverqueue.Config{}) // insert only
			if err != nil {
				return err
			}
			for _, b := range bodies {
				if _, err := c.Insert(ctx, bodyArgs{Body: b}, nil); err != nil {
					return err
				}
			}
			return nil
		},
	}
	conformance.TestQueueApp(t, app, conformanceToken)
}
