// Command river measures, on a real PostgreSQL with River's migrations,
// how long a River job still worked at a leaving worker's drain deadline
// takes to be run again by another worker:
//
//   - with the adapter (package worker/river): the deadline's fallback
//     (worker.Agent.Return, "return") makes the job available at once and
//     notifies the queue; the survivor's River client runs it;
//   - without it: the leaving worker just stops (its job's work never
//     returns, as in a killed process) and the job stays running until
//     River's rescuer, on the leader client every 30 s, finds it running
//     longer than RescueStuckJobsAfter and makes it retryable; River's
//     scheduler (every 5 s) makes it available after the retry backoff.
//     RescueStuckJobsAfter's default, 1 h, cannot be waited for in a run:
//     the command sets it (and JobTimeout, which it may not be below) to
//     -rescue-after (5 s) and prints the default beside it.
//
// The deadline comes -drain after the job began. Each mode runs -runs
// times in a database of its own; the row gives the medians:
//
//	queue | with adapter | without (queue's own timeout) | ratio
//
// Usage: go run ./bench/queues/river [-runs 3] [-rescue-after 5s] [-drain 1s]
// PostgreSQL: $DATABASE_URL (a user that may create databases), else a
// throwaway server started with hack/postgres.sh and stopped at exit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	riverqueue "github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/handoff-dev/handoff/internal/pgtest"
	"github.com/handoff-dev/handoff/worker"
	handoffriver "github.com/handoff-dev/handoff/worker/river"
)

var (
	runs        = flag.Int("runs", 3, "handovers measured per mode")
	rescueAfter = flag.Duration("rescue-after", 5*time.Second, "River's RescueStuckJobsAfter in the run without the adapter (River's default: 1h)")
	drain       = flag.Duration("drain", time.Second, "time from the job's start to the leaving worker's drain deadline")
	bound       = flag.Duration("bound", 3*time.Minute, "longest wait for one job to be run again")
)

// rescueAfterDefault is River's default RescueStuckJobsAfter
// (river.Config, maintenance.JobRescuerRescueAfterDefault).
const rescueAfterDefault = time.Hour

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "river:", err)
		os.Exit(1)
	}
}

func run() error {
	if *runs < 1 || *rescueAfter <= 0 || *drain <= 0 || *bound <= 0 {
		return errors.New("-runs: want 1 or more; -rescue-after, -drain, -bound: want durations above 0")
	}
	admin, stop, err := postgres()
	if err != nil {
		return err
	}
	defer stop()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		stop()
		os.Exit(130)
	}()

	var with, without []time.Duration
	for i := range *runs {
		d, err := measure(admin, fmt.Sprintf("with_%d", i), true)
		if err != nil {
			return fmt.Errorf("with the adapter: %w", err)
		}
		with = append(with, d)
		d, err = measure(admin, fmt.Sprintf("without_%d", i), false)
		if err != nil {
			return fmt.Errorf("without the adapter: %w", err)
		}
		without = append(without, d)
	}
	w, wo := median(with), median(without)
	// The row last: make queue-figures takes each command's last line.
	fmt.Printf("(median of %d runs each, drain deadline %s after the job began; with: %v; without: %v)\n", *runs, *drain, rounded(with), rounded(without))
	fmt.Println("queue | with adapter | without (queue's own timeout) | ratio")
	fmt.Printf("River v0.51.2 (riverpgxv5, PostgreSQL) | %s | %s (rescuer: RescueStuckJobsAfter and JobTimeout %s, River's defaults %s and 1m; rescuer every 30 s) | %.0fx\n",
		w.Round(time.Millisecond), wo.Round(time.Millisecond), *rescueAfter, rescueAfterDefault, float64(wo)/float64(w))
	return nil
}

// began is one job begun by a worker.
type began struct {
	worker string
	at     time.Time
}

// holdArgs is a job whose work never returns on the leaving worker (it
// ignores cancellation, as a killed process's does) and returns at once on
// the survivor.
type holdArgs struct{}

func (holdArgs) Kind() string { return "hold" }

type holdWorker struct {
	riverqueue.WorkerDefaults[holdArgs]
	name    string
	begins  chan<- began
	forever <-chan struct{} // closed at the end of the run
	block   bool
}

func (w *holdWorker) Work(_ context.Context, _ *riverqueue.Job[holdArgs]) error {
	w.begins <- began{worker: w.name, at: time.Now()}
	if w.block {
		<-w.forever
		return errors.New("leaving worker's work ended with the run")
	}
	return nil
}

// measure runs one handover in a new database and returns the time from
// the leaving worker's deadline to the survivor beginning the job.
func measure(admin, name string, adapter bool) (time.Duration, error) {
	ctx := context.Background()
	pool, drop, err := database(ctx, admin, name)
	if err != nil {
		return 0, err
	}
	defer drop()
	begins := make(chan began, 16)
	forever := make(chan struct{})
	var stops []func() // each client's stop, run before the database is dropped
	defer func() {
		close(forever) // the leaving worker's work returns
		for _, f := range slices.Backward(stops) {
			f()
		}
	}()

	config := func(worker string, block bool) *riverqueue.Config {
		workers := riverqueue.NewWorkers()
		riverqueue.AddWorker(workers, &holdWorker{name: worker, begins: begins, forever: forever, block: block})
		return &riverqueue.Config{
			ID:      worker + "-" + name,
			Logger:  slog.New(slog.DiscardHandler),
			Queues:  map[string]riverqueue.QueueConfig{riverqueue.QueueDefault: {MaxWorkers: 1}},
			Workers: workers,
			// The run without the adapter: River's own timeout, shortened.
			RescueStuckJobsAfter: *rescueAfter,
			// RescueStuckJobsAfter may not be below JobTimeout (1 min by
			// default), and the rescuer leaves a job alone while it is
			// within JobTimeout (forever with -1).
			JobTimeout: *rescueAfter,
		}
	}

	// runAdapter runs a's Run until the measure is over.
	runAdapter := func(a *handoffriver.Adapter) {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = a.Run(runCtx); close(done) }()
		stops = append(stops, func() { cancel(); <-done })
	}
	// startClient starts c until the measure is over.
	startClient := func(c *riverqueue.Client[pgx.Tx]) error {
		if err := c.Start(ctx); err != nil {
			return err
		}
		stops = append(stops, func() {
			sctx, cancel := context.WithTimeout(ctx, handoffriver.StopTimeout)
			defer cancel()
			_ = c.StopAndCancel(sctx)
		})
		return nil
	}
	var leaving *handoffriver.Adapter
	var leavingClient *riverqueue.Client[pgx.Tx]
	if adapter {
		leaving, err = handoffriver.New(pool, config("leaving", true), worker.Options{InsecureNoToken: true})
		if err != nil {
			return 0, err
		}
		runAdapter(leaving)
	} else {
		leavingClient, err = riverqueue.NewClient(riverpgxv5.New(pool), config("leaving", true))
		if err != nil {
			return 0, err
		}
		if err := startClient(leavingClient); err != nil {
			return 0, err
		}
	}
	insert, err := riverqueue.NewClient(riverpgxv5.New(pool), &riverqueue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, err
	}
	if _, err := insert.Insert(ctx, holdArgs{}, nil); err != nil {
		return 0, err
	}
	b, err := next(begins, *bound)
	if err != nil {
		return 0, fmt.Errorf("the leaving worker did not begin the job: %w", err)
	}
	if b.worker != "leaving" {
		return 0, fmt.Errorf("the job began on %s, want the leaving worker", b.worker)
	}

	// The survivor: its one worker is free for the job.
	if adapter {
		survivor, err := handoffriver.New(pool, config("survivor", false), worker.Options{InsecureNoToken: true})
		if err != nil {
			return 0, err
		}
		runAdapter(survivor)
	} else {
		survivor, err := riverqueue.NewClient(riverpgxv5.New(pool), config("survivor", false))
		if err != nil {
			return 0, err
		}
		if err := startClient(survivor); err != nil {
			return 0, err
		}
	}

	time.Sleep(time.Until(b.at.Add(*drain)))
	deadline := time.Now()
	if adapter {
		// The sidecar at the deadline: stop-claiming came at the preStop;
		// the fallback "return" hands back what is left.
		leaving.Agent().StopClaiming()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := leaving.Agent().Return(rctx, false, 0)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("hand back at the deadline: %w", err)
		}
		if n != 1 {
			return 0, fmt.Errorf("hand back at the deadline returned %d jobs, want 1", n)
		}
	} else {
		// The leaving worker stops fetching; its job's work never returns.
		go func() { _ = leavingClient.Stop(context.WithoutCancel(ctx)) }()
	}
	again, err := next(begins, *bound)
	if err != nil {
		return 0, err
	}
	if again.worker != "survivor" {
		return 0, fmt.Errorf("job begun again by %s, want the survivor", again.worker)
	}
	return again.at.Sub(deadline), nil
}

func next(begins <-chan began, bound time.Duration) (began, error) {
	select {
	case b := <-begins:
		return b, nil
	case <-time.After(bound):
		return began{}, fmt.Errorf("no job begun within %s", bound)
	}
}

// database creates database name with River's tables and returns a pool
// on it and the func that drops it.
func database(ctx context.Context, admin, name string) (*pgxpool.Pool, func(), error) {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = conn.Close(ctx) }()
	db := "bench_river_" + name
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
		return nil, nil, err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		return nil, nil, err
	}
	cfg, err := pgxpool.ParseConfig(admin)
	if err != nil {
		return nil, nil, err
	}
	cfg.ConnConfig.Database = db
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	drop := func() {
		pool.Close()
		if c, err := pgx.Connect(context.Background(), admin); err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
			_ = c.Close(context.Background())
		}
	}
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err == nil {
		_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	}
	if err != nil {
		drop()
		return nil, nil, fmt.Errorf("migrate River's tables: %w", err)
	}
	return pool, drop, nil
}

// postgres returns the admin URL of a server: $DATABASE_URL, else one
// started by hack/postgres.sh in a temporary directory
// (pgtest.StartServer), which the returned func stops.
func postgres() (string, func(), error) {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u, func() {}, nil
	}
	return pgtest.StartServer()
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func rounded(ds []time.Duration) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond).String()
	}
	return out
}
