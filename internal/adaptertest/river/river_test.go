package river_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	riverqueue "github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/handoff-dev/handoff/internal/pgtest"
	"github.com/handoff-dev/handoff/worker"
	handoffriver "github.com/handoff-dev/handoff/worker/river"
)

func TestMain(m *testing.M) { pgtest.Run(m) }

// wait bounds every wait of these tests; River's rescuer would take an
// hour (RescueStuckJobsAfter's default), so a job run again within it was
// handed back.
const wait = 30 * time.Second

// stepArgs is a job that works for HoldMillis (until its context ends if
// 0) and then applies its effect, one row in applications, fenced
// (Adapter.Fence) and completed in the same transaction.
type stepArgs struct {
	HoldMillis int `json:"hold_ms"`
	// Block: the work waits for its worker's release, even if its context
	// ends, instead of HoldMillis.
	Block bool `json:"block"`
}

func (stepArgs) Kind() string { return "step" }

// stepWorker works stepArgs for one worker.
type stepWorker struct {
	riverqueue.WorkerDefaults[stepArgs]
	name    string
	pool    *pgxpool.Pool
	started chan start
	adapter *handoffriver.Adapter
	release chan struct{} // closed to let Block jobs go on
}

// start is one job begun by a worker.
type start struct {
	worker  string
	id      int64
	attempt int
}

func (w *stepWorker) Work(ctx context.Context, j *riverqueue.Job[stepArgs]) error {
	w.started <- start{worker: w.name, id: j.ID, attempt: j.Attempt}
	var hold <-chan time.Time
	if j.Args.HoldMillis > 0 || j.Args.Block {
		hold = time.After(time.Duration(j.Args.HoldMillis) * time.Millisecond)
	}
	if j.Args.Block {
		<-w.release
		ctx = context.WithoutCancel(ctx)
	}
	select {
	case <-hold:
	case <-ctx.Done():
		return ctx.Err()
	}
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if err := w.adapter.Fence(ctx, tx, j.JobRow); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO applications (job_id, worker) VALUES ($1, $2)`, j.ID, w.name); err != nil {
			return err
		}
		_, err := riverqueue.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, j)
		return err
	})
}

// env is one database with River's tables and an applications table.
type env struct {
	pool    *pgxpool.Pool
	started chan start
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		t.Fatalf("River's migrations: %v", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE applications (job_id bigint NOT NULL, worker text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &env{pool: pool, started: make(chan start, 1000)}
}

// worker is one running adapter.
type runningWorker struct {
	a    *handoffriver.Adapter
	w    *stepWorker
	stop func() error
}

// startWorker runs an adapter named name with maxWorkers workers until
// the test ends.
func (e *env) startWorker(t *testing.T, name string, maxWorkers int) *runningWorker {
	t.Helper()
	workers := riverqueue.NewWorkers()
	w := &stepWorker{name: name, pool: e.pool, started: e.started, release: make(chan struct{})}
	riverqueue.AddWorker(workers, w)
	a, err := handoffriver.New(e.pool, &riverqueue.Config{
		ID:                name,
		Queues:            map[string]riverqueue.QueueConfig{riverqueue.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:           workers,
		FetchPollInterval: 5 * time.Second, // a hand back is seen by the notification, not a poll
	}, worker.Options{InsecureNoToken: true})
	if err != nil {
		t.Fatal(err)
	}
	w.adapter = a
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("%s: Run: %v", name, err)
		}
	})
	return &runningWorker{a: a, w: w, stop: stop}
}

func (e *env) insert(t *testing.T, args stepArgs) int64 {
	t.Helper()
	// Insert only: a client without Queues and Workers.
	c, err := riverqueue.NewClient[pgx.Tx](riverpgxv5.New(e.pool), &riverqueue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Insert(context.Background(), args, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.Job.ID
}

// next waits for the next job begun.
func (e *env) next(t *testing.T) start {
	t.Helper()
	select {
	case s := <-e.started:
		return s
	case <-time.After(wait):
		t.Fatalf("no job began within %s", wait)
		return start{}
	}
}

func (e *env) state(t *testing.T, id int64) (state string, attempt int) {
	t.Helper()
	if err := e.pool.QueryRow(context.Background(), `SELECT state, attempt FROM river_job WHERE id = $1`, id).Scan(&state, &attempt); err != nil {
		t.Fatal(err)
	}
	return state, attempt
}

// applications counts the effects applied, by job id.
func (e *env) applications(t *testing.T) map[int64]int {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT job_id, count(*) FROM applications GROUP BY job_id`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]int{}
	for rows.Next() {
		var id int64
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitState waits until job id is in state.
func (e *env) waitState(t *testing.T, id int64, want string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		got, _ := e.state(t, id)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			var errs []string
			_ = e.pool.QueryRow(context.Background(), `SELECT errors::text[] FROM river_job WHERE id = $1`, id).Scan(&errs)
			t.Fatalf("job %d is %s after %s, want %s; its errors: %v", id, got, wait, want, errs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNewRefusesOptionsTheAdapterSets(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	workers := riverqueue.NewWorkers()
	riverqueue.AddWorker(workers, &stepWorker{})
	cfg := &riverqueue.Config{Queues: map[string]riverqueue.QueueConfig{riverqueue.QueueDefault: {MaxWorkers: 1}}, Workers: workers}
	for _, tc := range []struct {
		field string
		opts  worker.Options
	}{
		{"ReturnClaims", worker.Options{InsecureNoToken: true, ReturnClaims: func(context.Context) (int, error) { return 0, nil }}},
		{"HandBack", worker.Options{InsecureNoToken: true, HandBack: func(context.Context, []*worker.Claim) error { return nil }}},
	} {
		if _, err := handoffriver.New(pool, cfg, tc.opts); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New with Options.%s set: error %v, want one naming %s", tc.field, err, tc.field)
		}
	}
	if _, err := handoffriver.New(pool, &riverqueue.Config{}, worker.Options{InsecureNoToken: true}); err == nil || !strings.Contains(err.Error(), "Queues") {
		t.Errorf("New without Queues: error %v, want one naming Queues", err)
	}
	if _, err := handoffriver.New(pool, cfg, worker.Options{InsecureNoToken: true}); err != nil {
		t.Errorf("New: %v", err)
	}
}

// TestStopClaimingStopsIntake: after stop-claiming a worker starts no new
// job (another worker runs it), its running job drains, and the drain
// counts it until River's completer has written it.
func TestStopClaimingStopsIntake(t *testing.T) {
	e := newEnv(t)
	a := e.startWorker(t, "a", 4)
	agent := a.a.Agent()
	first := e.insert(t, stepArgs{HoldMillis: 1500})
	if s := e.next(t); s.worker != "a" || s.id != first {
		t.Fatalf("began %+v, want job %d on a", s, first)
	}
	if got := agent.InFlight(); got != 1 {
		t.Errorf("InFlight with one job running = %d, want 1", got)
	}
	agent.StopClaiming()
	second := e.insert(t, stepArgs{HoldMillis: 1})
	e.startWorker(t, "b", 4)
	if s := e.next(t); s.worker != "b" || s.id != second {
		t.Fatalf("after a's stop-claiming began %+v, want job %d on b", s, second)
	}
	if got, unstarted := agent.InFlight(), agent.Unstarted(); got != 1 || unstarted != 0 {
		t.Errorf("a draining one job: InFlight %d, Unstarted %d; want 1, 0", got, unstarted)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := agent.WaitDrained(ctx); err != nil {
		t.Fatalf("a not drained: %v", err)
	}
	if st, _ := e.state(t, first); st != "completed" {
		t.Errorf("a drained with job %d %s, want it completed in the table first", first, st)
	}
	e.waitState(t, second, "completed")
	if apps := e.applications(t); apps[first] != 1 || apps[second] != 1 {
		t.Errorf("applications %v, want one of each job", apps)
	}
	select {
	case s := <-e.started:
		t.Errorf("began %+v, want nothing more", s)
	default:
	}
}

// TestReturnAtDeadline: a job still worked at the drain deadline is run by
// another worker at once (not after River's rescuer, an hour), once, and
// the leaving worker's late result is not written.
func TestReturnAtDeadline(t *testing.T) {
	e := newEnv(t)
	a := e.startWorker(t, "a", 4)
	agent := a.a.Agent()
	id := e.insert(t, stepArgs{}) // works until its context ends
	if s := e.next(t); s.worker != "a" || s.id != id {
		t.Fatalf("began %+v, want job %d on a", s, id)
	}
	e.startWorker(t, "b", 4)
	agent.StopClaiming()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	n, err := agent.Return(ctx, false, 0)
	if err != nil || n != 1 {
		t.Fatalf("Return = %d, %v; want 1, nil", n, err)
	}
	if got := agent.InFlight(); got != 0 {
		t.Errorf("InFlight after Return = %d, want 0", got)
	}
	s := e.next(t)
	if s.worker != "b" || s.id != id || s.attempt != 1 {
		t.Fatalf("after the hand back began %+v, want job %d on b, attempt 1 (a hand back is not an attempt)", s, id)
	}
	// b works until its context ends: b's stop cancels it, then it is
	// available again (snoozed), not failed.
	e.waitState(t, id, "running")
	if n, err := agent.Return(ctx, false, 0); err != nil || n != 0 {
		t.Errorf("second Return = %d, %v; want 0, nil", n, err)
	}
	// a's work ended at the hand back; its stop flushes River's completer,
	// which would write the late result if it were not dropped.
	if err := a.stop(); err != nil {
		t.Fatalf("a: Run: %v", err)
	}
	if st, _ := e.state(t, id); st != "running" {
		t.Errorf("job %d %s after a's late result, want still running on b", id, st)
	}
	if apps := e.applications(t); len(apps) != 0 {
		t.Errorf("applications %v, want none: the work never finished", apps)
	}
}

// TestWorkOutlivingItsHandBackIsFenced: work that ignores cancellation
// and finishes after its job was handed back and taken by another worker
// neither applies its effect (Adapter.Fence refuses it) nor writes its
// result over the other worker's run (the adapter drops it), and the job
// is applied once, by the worker that took it.
func TestWorkOutlivingItsHandBackIsFenced(t *testing.T) {
	e := newEnv(t)
	a := e.startWorker(t, "a", 4)
	agent := a.a.Agent()
	id := e.insert(t, stepArgs{HoldMillis: 1, Block: true})
	e.next(t)
	b := e.startWorker(t, "b", 4)
	agent.StopClaiming()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if n, err := agent.Return(ctx, false, 0); err != nil || n != 1 {
		t.Fatalf("Return = %d, %v; want 1, nil", n, err)
	}
	if s := e.next(t); s.worker != "b" || s.id != id {
		t.Fatalf("began %+v, want job %d on b", s, id)
	}
	close(a.w.release)
	if err := a.stop(); err != nil { // waits for a's work and flushes a's completer
		t.Fatalf("a: Run: %v", err)
	}
	var st, last string
	if err := e.pool.QueryRow(ctx, `SELECT state, attempted_by[array_length(attempted_by, 1)] FROM river_job WHERE id = $1`, id).Scan(&st, &last); err != nil {
		t.Fatal(err)
	}
	if st != "running" || last != "b" {
		t.Errorf("after a's late work job %d is %s, last attempted by %s; want still running on b", id, st, last)
	}
	close(b.w.release)
	e.waitState(t, id, "completed")
	var workers []string
	if err := e.pool.QueryRow(ctx, `SELECT array_agg(worker) FROM applications WHERE job_id = $1`, id).Scan(&workers); err != nil {
		t.Fatal(err)
	}
	if len(workers) != 1 || workers[0] != "b" {
		t.Errorf("job %d applied by %v, want once, by b", id, workers)
	}
}

// TestRescuedJobFetchedAgainEndsTheOldClaim: a job taken from a worker
// while still worked there (River's rescuer makes it retryable, then
// available) and fetched again by the same worker is one claim, not two.
func TestRescuedJobFetchedAgainEndsTheOldClaim(t *testing.T) {
	e := newEnv(t)
	a := e.startWorker(t, "a", 4)
	defer close(a.w.release)
	agent := a.a.Agent()
	id := e.insert(t, stepArgs{HoldMillis: 1, Block: true})
	if s := e.next(t); s.attempt != 1 {
		t.Fatalf("began %+v, want attempt 1", s)
	}
	ctx := context.Background()
	// What the rescuer and then River's scheduler do to a stuck job.
	if _, err := e.pool.Exec(ctx, `UPDATE river_job SET state = 'available', scheduled_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if err := riverpgxv5.New(e.pool).GetExecutor().NotifyMany(ctx, &riverdriver.NotifyManyParams{Payload: []string{`{"queue": "default"}`}, Topic: "river_insert"}); err != nil {
		t.Fatal(err)
	}
	if s := e.next(t); s.worker != "a" || s.id != id || s.attempt != 2 {
		t.Fatalf("began %+v, want job %d again on a, attempt 2", s, id)
	}
	if got := agent.InFlight(); got != 1 {
		t.Errorf("InFlight with one job running (its first attempt rescued) = %d, want 1", got)
	}
}

// TestCancelFallbackHandsBackAtOnce: work canceled by the "cancel"
// fallback is available again at once, its attempt not counted.
func TestCancelFallbackHandsBackAtOnce(t *testing.T) {
	e := newEnv(t)
	a := e.startWorker(t, "a", 4)
	agent := a.a.Agent()
	id := e.insert(t, stepArgs{})
	e.next(t)
	agent.StopClaiming()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	n, err := agent.Return(ctx, true, wait)
	if err != nil || n != 1 {
		t.Fatalf("Return(cancel) = %d, %v; want 1 (the canceled job, handed back by its snooze, counts as returned: docs/protocol.md), nil", n, err)
	}
	st, attempt := e.state(t, id)
	if st != "available" || attempt != 0 {
		t.Fatalf("job %d after cancel: %s, attempt %d; want available, attempt 0", id, st, attempt)
	}
	e.startWorker(t, "b", 4)
	if s := e.next(t); s.worker != "b" || s.id != id {
		t.Fatalf("began %+v, want job %d on b", s, id)
	}
}

// TestHandoverNothingLostOrTwice: jobs keep flowing while worker a hands
// over to b mid-stream (stop-claiming, drain, deadline with cancel):
// every job is applied exactly once.
func TestHandoverNothingLostOrTwice(t *testing.T) {
	e := newEnv(t)
	const jobs = 40
	ids := make([]int64, 0, jobs)
	for i := range jobs {
		ids = append(ids, e.insert(t, stepArgs{HoldMillis: 20 + 40*(i%5)}))
	}
	a := e.startWorker(t, "a", 4)
	e.startWorker(t, "b", 4)
	agent := a.a.Agent()
	for range 8 {
		e.next(t)
	}
	agent.StopClaiming()
	dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond) // a short drain deadline
	_ = agent.WaitDrained(dctx)
	dcancel()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := agent.Return(ctx, true, time.Second); err != nil {
		t.Fatalf("Return: %v", err)
	}
	if err := a.stop(); err != nil {
		t.Fatalf("a: Run: %v", err)
	}
	for _, id := range ids {
		e.waitState(t, id, "completed")
	}
	apps := e.applications(t)
	for _, id := range ids {
		if apps[id] != 1 {
			t.Errorf("job %d applied %d times, want 1", id, apps[id])
		}
	}
	if len(apps) != jobs {
		t.Errorf("%d jobs applied, want %d", len(apps), jobs)
	}
}
