// Command riverworker is a River worker (github.com/riverqueue/river on
// PostgreSQL) that hands over cleanly with the handoff sidecar, through the
// adapter in package worker/river:
//
//   - it runs "apply" jobs (river.Insert(ctx, riverworker.ApplyArgs{Key: …},
//     nil)): each works for its Millis, then writes its key to the table
//     riverworker_applied in a transaction fenced by the adapter
//     (Adapter.Fence) that also completes the job (river.JobCompleteTx),
//     so a job handed back at the drain deadline is applied at most once;
//   - the sidecar's stop-claiming stops River's fetches at once, the drain
//     waits for the running jobs, and its fallback at the deadline makes
//     the rest available to the other workers at once.
//
// On SIGTERM or SIGINT it stops the River client (running jobs' contexts
// canceled; those that end are available again at once) and exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	riverqueue "github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"go.uber.org/zap"

	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
	handoffriver "github.com/handoff-dev/handoff/worker/river"
)

// ApplyArgs is the job this worker runs.
type ApplyArgs struct {
	// Key is written to riverworker_applied once the work is done.
	Key string `json:"key"`
	// Millis is how long the work takes, in milliseconds.
	Millis int `json:"millis"`
}

// Kind is River's job kind.
func (ApplyArgs) Kind() string { return "apply" }

// applyWorker works ApplyArgs.
type applyWorker struct {
	riverqueue.WorkerDefaults[ApplyArgs]
	pool    *pgxpool.Pool
	adapter *handoffriver.Adapter
	name    string
}

func (w *applyWorker) Work(ctx context.Context, j *riverqueue.Job[ApplyArgs]) error {
	select {
	case <-time.After(time.Duration(j.Args.Millis) * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if err := w.adapter.Fence(ctx, tx, j.JobRow); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO riverworker_applied (key, job_id, worker) VALUES ($1, $2, $3)`, j.Args.Key, j.ID, w.name); err != nil {
			return err
		}
		_, err := riverqueue.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, j)
		return err
	})
}

// options are the command-line flags.
type options struct {
	databaseURL      string
	workerID         string
	handoffAddr      string
	handoffTokenFile string
	concurrency      int
	migrate          bool
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("riverworker", flag.ContinueOnError)
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL URL, like postgres://user@host:5432/db (default $DATABASE_URL)")
	fs.StringVar(&o.workerID, "worker-id", "", "River client ID and name in riverworker_applied (default $HANDOFF_POD_NAME, else the host name)")
	fs.StringVar(&o.handoffAddr, "handoff-addr", "", "where to serve the handoff app API, for the sidecar: unix:///handoff-run/app.sock, or a loopback address like http://127.0.0.1:7452 (default $"+protocol.AppURLEnv+", which the injector sets)")
	fs.StringVar(&o.handoffTokenFile, "handoff-token-file", "", "file with the pod's token (default $HANDOFF_TOKEN_FILE, set by the injector)")
	fs.IntVar(&o.concurrency, "concurrency", 4, "jobs worked at once (River's MaxWorkers of the default queue)")
	fs.BoolVar(&o.migrate, "migrate", true, "run River's migrations and create riverworker_applied at start")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.databaseURL == "" {
		o.databaseURL = os.Getenv("DATABASE_URL")
	}
	if o.databaseURL == "" {
		return o, errors.New("--database-url or $DATABASE_URL is required")
	}
	if o.workerID == "" {
		o.workerID = os.Getenv("HANDOFF_POD_NAME")
	}
	if o.workerID == "" {
		host, err := os.Hostname()
		if err != nil {
			return o, fmt.Errorf("--worker-id not set and no host name: %w", err)
		}
		o.workerID = host
	}
	if o.concurrency < 1 {
		return o, fmt.Errorf("--concurrency %d: want 1 or more", o.concurrency)
	}
	return o, nil
}

func main() { os.Exit(main1()) }

// main1 is main, returning the exit code: 0 after a signal, 1 on an error,
// 2 for bad flags.
func main1() int {
	log := zapr.NewLogger(zap.Must(zap.NewProduction()))
	opts, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		log.Error(err, "bad flags")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, log.WithValues("worker", opts.workerID), opts, worker.Options{TokenFile: opts.handoffTokenFile}); err != nil {
		log.Error(err, "exiting")
		return 1
	}
	return 0
}

// run works until ctx ends; wopts are the Agent's options (Logger is set
// here).
func run(ctx context.Context, log logr.Logger, opts options, wopts worker.Options) error {
	pool, err := pgxpool.New(ctx, opts.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if opts.migrate {
		if err := migrate(ctx, pool); err != nil {
			return err
		}
	}
	w := &applyWorker{pool: pool, name: opts.workerID}
	workers := riverqueue.NewWorkers()
	riverqueue.AddWorker(workers, w)
	wopts.Logger = log.WithName("handoff")
	a, err := handoffriver.New(pool, &riverqueue.Config{
		ID:      opts.workerID,
		Queues:  map[string]riverqueue.QueueConfig{riverqueue.QueueDefault: {MaxWorkers: opts.concurrency}},
		Workers: workers,
	}, wopts)
	if err != nil {
		return err
	}
	w.adapter = a
	// A server that cannot serve (the address taken) stops the worker: the
	// sidecar could not hand it over.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan error, 1)
	go func() {
		err := a.Agent().ListenAndServe(ctx, opts.handoffAddr)
		cancel()
		served <- err
	}()
	log.Info("working", "handoffAddr", opts.handoffAddr)
	runErr := a.Run(ctx)
	return errors.Join(runErr, <-served)
}

// migrateLock is the key of the advisory lock migrate holds: replicas that
// start together migrate one at a time (rivermigrate takes no lock itself,
// and two concurrent CREATE TABLEs of River's tables fail).
const migrateLock = 0x72697665 // "rive"

// migrate runs River's migrations and creates riverworker_applied under
// migrateLock, held by a connection of its own (River's migrations run
// each in its own transaction: one of them adds an enum value a later one
// uses): idempotent, and safe for replicas starting at once (the later
// ones find the versions applied and do nothing).
func migrate(ctx context.Context, pool *pgxpool.Pool) (err error) {
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrateLock); err != nil {
		return fmt.Errorf("lock for River's migrations: %w", err)
	}
	defer func() {
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, migrateLock); uerr != nil {
			conn.Conn().Close(context.WithoutCancel(ctx)) //nolint:errcheck // closing the session ends its lock
			err = errors.Join(err, fmt.Errorf("unlock River's migrations: %w", uerr))
		}
	}()
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate River's tables: %w", err)
	}
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS riverworker_applied (key text NOT NULL, job_id bigint NOT NULL, worker text NOT NULL)`)
	return err
}
