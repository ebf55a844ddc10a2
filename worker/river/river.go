// Package river runs a River client (github.com/riverqueue/river, on
// PostgreSQL through riverpgxv5) as a handoff worker: each job River runs is
// a claim of a worker.Agent, so the sidecar's drain sees River's jobs, and
// at the drain deadline the jobs still running are made available to the
// other workers at once instead of after River's rescuer.
//
// River fetches jobs itself and runs each in a goroutine of its own, so the
// adapter does not loop: it wraps River's driver and adds a worker
// middleware.
//
//   - A fetch (River's JobGetAvailable) is a pending receive
//     (worker.Agent.Receive), and each job it locks is held
//     (worker.Receive.Hold) before River starts it, so a job fetched in the
//     race with stop-claiming is counted in flight.
//   - Stop-claiming: from then on every fetch returns no job without
//     locking any (intake stops at once, on every queue of the client), and
//     Run calls River's Client.Stop, which stops its fetch loops and lets
//     the running jobs finish.
//   - A claim is done once River's completer has written the job's result
//     (River's JobSetStateIfRunningMany returned), not when the work
//     returns: until then the job is still running in the table.
//   - Unstarted: none. River starts every job it fetches at once (it
//     fetches at most as many as it has free workers), so
//     worker.Agent.Unstarted stays 0 and Options.HandBack is not used.
//   - Hand back at the deadline (Options.ReturnClaims): a job whose work
//     has not returned is made available at once, in one UPDATE fenced by
//     the job's id, its state running, its attempt and attempted_at (set
//     by each fetch) and this client as its last attempted_by, with the attempt not counted (as River's
//     JobSnooze does); River's insert notification then wakes the other
//     clients' fetch. Its work's context is canceled, and the result it
//     returns later is dropped before River's completer writes it, so this
//     worker never overwrites the job another worker now runs.
//   - Canceled work (the sidecar's "cancel" fallback, worker.ErrCanceled,
//     or the end of Run's context) that returns an error is snoozed for 0 s
//     (river.JobSnooze(0)): available again at once, the attempt not
//     counted, instead of retryable after River's backoff.
//   - Keep-alive: River has no visibility timeout for running jobs; its
//     rescuer (on the leader client, every 30 s) makes a job retryable once
//     it has run longer than Config.RescueStuckJobsAfter (1 h by default)
//     from its attempted_at, even while it is still worked. The adapter
//     does not extend that: give RescueStuckJobsAfter more than the longest
//     job plus the drain. When the rescuer has taken a job still worked
//     here, its claim ends at the job's next fetch (by any client here
//     again, or at the deadline's hand back, which then finds it no longer
//     this attempt's and leaves it); the late result of the rescued attempt
//     is River's to write, unfenced.
//
// Completion in River is not fenced (its completer, and JobCompleteTx,
// update any running row of the job's id), so work that outlives its hand
// back, in this process or one that River's rescuer gave up on, may apply
// its effect while another worker runs the job. Fence the effect: apply it
// in a transaction that calls Adapter.Fence first and completes the job
// with river.JobCompleteTx, or key it by job id.
package river

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	riverqueue "github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/handoff-dev/handoff/worker"
)

// StopTimeout bounds Run's hard stop (River's Client.StopAndCancel) once
// Run's context has ended: jobs whose work ignores cancellation longer are
// left running in the table.
const StopTimeout = 10 * time.Second

// errHandedBack is the cause of the context of a job's work canceled
// because ReturnClaims handed the job back.
var errHandedBack = errors.New("handoff river: job handed back at the drain deadline")

// errLeaving is the cause of the context of a job's work canceled because
// Run's context ended.
var errLeaving = errors.New("handoff river: worker leaving")

// ErrFenced is returned by Adapter.Fence when the job is no longer
// running as the attempt the work was given: it was handed back, rescued,
// canceled or finished since.
var ErrFenced = errors.New("handoff river: the job is no longer running as this attempt of this client")

// Adapter is a River client run as a handoff worker. Its methods are safe
// for concurrent use.
type Adapter struct {
	agent  *worker.Agent
	client *riverqueue.Client[pgx.Tx]
	pool   *pgxpool.Pool
	exec   riverdriver.Executor // River's, unwrapped: for the insert notification
	table  string               // river_job, schema-qualified and quoted
	schema string

	mu   sync.Mutex
	jobs map[int64]*job // jobs fetched and not yet written by the completer
	// handedBack are the jobs ReturnClaims handed back whose result River's
	// completer has not yet been stopped from writing. Only a worker that
	// has stopped claiming hands back, so it fetches none of them again.
	handedBack map[int64]struct{}
	leaving    bool // Run's context has ended
	// canceledSnoozes counts the jobs whose work ended because of the
	// "cancel" fallback and was snoozed (available again at once), since
	// the last returnClaims.
	canceledSnoozes int
}

// job is one job fetched by this client: its claim until River's
// completer writes its result.
type job struct {
	id          int64
	attempt     int
	attemptedAt time.Time // set by each fetch: with attempt and the client, the fencing token
	queue       string
	claim       *worker.Claim
	// cancel cancels the work's context; nil until the middleware runs.
	cancel context.CancelCauseFunc
	// worked: the work returned, its result is queued in River's completer.
	worked bool
	// handedBack: ReturnClaims took it; its result is dropped.
	handedBack bool
	done       chan struct{} // closed when the claim is done
}

// New returns an Adapter whose River client (river.NewClient with
// riverpgxv5 on pool) runs the jobs of config, and the Agent
// (worker.New(opts)) whose claims they are. config is copied; the adapter's
// worker middleware is put first in its Plugins. opts.ReturnClaims is the
// adapter's own, and opts.HandBack stays nil (River holds no unstarted
// job): New returns an error naming the field if either is set. It also
// returns worker.New's and river.NewClient's errors (config must have
// Queues and Workers: the client works jobs), and an error if pool or
// config is nil.
func New(pool *pgxpool.Pool, config *riverqueue.Config, opts worker.Options) (*Adapter, error) {
	switch {
	case pool == nil:
		return nil, errors.New("handoff river: pool is nil: want the *pgxpool.Pool of River's database")
	case config == nil:
		return nil, errors.New("handoff river: config is nil: want a *river.Config with Queues and Workers")
	case opts.ReturnClaims != nil:
		return nil, errors.New("handoff river: worker.Options.ReturnClaims is set: leave it nil, the adapter hands back River's running jobs itself")
	case opts.HandBack != nil:
		return nil, errors.New("handoff river: worker.Options.HandBack is set: leave it nil, River starts every job it fetches at once, so none is held unstarted")
	}
	if len(config.Queues) == 0 || config.Workers == nil {
		return nil, errors.New("handoff river: config.Queues and config.Workers are empty: want the queues and workers of the jobs this worker runs")
	}
	a := &Adapter{pool: pool, jobs: map[int64]*job{}, handedBack: map[int64]struct{}{}, schema: config.Schema}
	opts.ReturnClaims = a.returnClaims
	agent, err := worker.New(opts)
	if err != nil {
		return nil, err
	}
	a.agent = agent

	cfg := *config
	cfg.Plugins = append([]rivertype.Plugin{&middleware{a: a}}, config.Plugins...)
	inner := riverpgxv5.New(pool)
	a.exec = inner.GetExecutor()
	client, err := riverqueue.NewClient[pgx.Tx](&driver{Driver: inner, a: a}, &cfg)
	if err != nil {
		return nil, fmt.Errorf("handoff river: %w", err)
	}
	a.client = client
	a.table = pgx.Identifier{"river_job"}.Sanitize()
	if cfg.Schema != "" {
		a.table = pgx.Identifier{cfg.Schema, "river_job"}.Sanitize()
	}
	return a, nil
}

// Agent is the worker.Agent whose claims are River's jobs: serve its
// Handler (or ListenAndServe) to the sidecar.
func (a *Adapter) Agent() *worker.Agent { return a.agent }

// Client is the River client, to insert jobs, subscribe to events and so
// on. Start and stop it through Run only.
func (a *Adapter) Client() *riverqueue.Client[pgx.Tx] { return a.client }

// Run starts the River client and works jobs until ctx ends. At
// stop-claiming (the Agent's Stopping) it calls River's Client.Stop: the
// fetch loops end and running jobs finish; the drain deadline's fallback
// hands back the rest. When ctx ends, Run calls Client.StopAndCancel
// (running jobs' contexts are canceled; those that then return an error
// are made available at once) and waits up to StopTimeout for the client
// to stop. It returns nil after a stop on ctx, River's error if the client
// cannot start, and the hard stop's error (context.DeadlineExceeded after
// StopTimeout).
func (a *Adapter) Run(ctx context.Context) error {
	// Start's context is not ctx: River hard-stops on its end, and Run
	// orders the stop itself.
	if err := a.client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("handoff river: start the River client: %w", err)
	}
	stopping := false
	select {
	case <-a.agent.Stopping():
		// Fetches already return nothing; Stop ends the fetch loops and
		// flushes the completer once running jobs finish.
		stopping = true
		go func() { _ = a.client.Stop(context.WithoutCancel(ctx)) }()
		<-ctx.Done()
	case <-ctx.Done():
	}
	a.mu.Lock()
	a.leaving = true
	for _, j := range a.jobs {
		if j.cancel != nil {
			j.cancel(errLeaving)
		}
	}
	a.mu.Unlock()
	sctx, cancel := context.WithTimeout(context.Background(), StopTimeout)
	defer cancel()
	if !stopping {
		// A Stop under way holds River's stop lock until the jobs return,
		// so StopAndCancel would wait for it: the jobs' contexts are
		// canceled above instead.
		go func() { _ = a.client.StopAndCancel(sctx) }()
	}
	select {
	case <-a.client.Stopped():
		return nil
	case <-sctx.Done():
		return fmt.Errorf("handoff river: River client not stopped after %s: %w", StopTimeout, sctx.Err())
	}
}

// Fence is the fencing token check for a job's effect. In the transaction
// that applies the effect, before the effect, it locks the job's row
// (SELECT … FOR UPDATE) and returns nil if the job is still running as
// job's attempt (its attempt and attempted_at, which each fetch sets), with
// this client as the last of its attempted_by;
// complete the job in the same transaction (river.JobCompleteTx). A hand
// back (the drain deadline's) and River's rescuer update the row, so they
// wait for that transaction, and after either Fence returns ErrFenced: an
// effect is then applied at most once per job, even by work that outlives
// its hand back. It returns ErrFenced, or the query's error.
func (a *Adapter) Fence(ctx context.Context, tx pgx.Tx, job *rivertype.JobRow) error {
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM `+a.table+`
WHERE id = $1 AND state = 'running' AND attempt = $2 AND attempted_at = $3
  AND attempted_by[array_length(attempted_by, 1)] = $4
FOR UPDATE`, job.ID, job.Attempt, attemptedAt(job), a.client.ID()).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrFenced
	}
	if err != nil {
		return fmt.Errorf("handoff river: fence job %d: %w", job.ID, err)
	}
	return nil
}

// returnClaims is Options.ReturnClaims: it hands back every job whose work
// has not returned (see the package doc), waits until River's completer
// has written the jobs whose work has returned, and says how many jobs it
// made available, counting those whose work ended because of the "cancel"
// fallback and was snoozed since the last call.
func (a *Adapter) returnClaims(ctx context.Context) (int, error) {
	a.mu.Lock()
	var back, wait []*job
	for _, j := range a.jobs {
		switch {
		case j.handedBack:
		case j.worked:
			wait = append(wait, j)
		default:
			j.handedBack = true
			a.handedBack[j.id] = struct{}{}
			if j.cancel != nil {
				j.cancel(errHandedBack)
			}
			back = append(back, j)
		}
	}
	a.mu.Unlock()

	n, err := a.handBack(ctx, back)
	for _, j := range back {
		a.finish(j.id)
	}
	for _, j := range wait {
		select {
		case <-j.done:
		case <-ctx.Done():
			return n, errors.Join(err, fmt.Errorf("handoff river: results of worked jobs not written by River's completer: %w", ctx.Err()))
		}
	}
	a.mu.Lock()
	n += a.canceledSnoozes
	a.canceledSnoozes = 0
	a.mu.Unlock()
	return n, err
}

// handBack makes jobs available at once if they are still running as
// this client's attempt, and notifies their queues.
func (a *Adapter) handBack(ctx context.Context, jobs []*job) (int, error) {
	if len(jobs) == 0 {
		return 0, nil
	}
	ids := make([]int64, len(jobs))
	attempts := make([]int32, len(jobs))
	ats := make([]time.Time, len(jobs))
	queues := map[string]struct{}{}
	for i, j := range jobs {
		ids[i], attempts[i], ats[i] = j.id, int32(j.attempt), j.attemptedAt //nolint:gosec // River's attempt is an int column
		queues[j.queue] = struct{}{}
	}
	tag, err := a.pool.Exec(ctx, `UPDATE `+a.table+` AS j
SET state = 'available', scheduled_at = now(), attempt = j.attempt - 1
FROM unnest($1::bigint[], $2::int[], $3::timestamptz[]) AS h(id, attempt, attempted_at)
WHERE j.id = h.id AND j.state = 'running' AND j.attempt = h.attempt AND j.attempted_at = h.attempted_at
  AND j.attempted_by[array_length(j.attempted_by, 1)] = $4`, ids, attempts, ats, a.client.ID())
	if err != nil {
		return 0, fmt.Errorf("handoff river: hand back %d running jobs: %w", len(jobs), err)
	}
	payloads := make([]string, 0, len(queues))
	for q := range queues {
		payloads = append(payloads, fmt.Sprintf(`{"queue": %q}`, q))
	}
	// River's insert topic: the other clients fetch at once, not at their
	// next poll (FetchPollInterval).
	if err := a.exec.NotifyMany(ctx, &riverdriver.NotifyManyParams{Payload: payloads, Schema: a.schema, Topic: "river_insert"}); err != nil {
		return int(tag.RowsAffected()), fmt.Errorf("handoff river: notify queues of %d jobs handed back: %w", tag.RowsAffected(), err)
	}
	return int(tag.RowsAffected()), nil
}

// attemptedAt is row's attempted_at; a fetched row always has one.
func attemptedAt(row *rivertype.JobRow) time.Time {
	if row.AttemptedAt == nil {
		return time.Time{}
	}
	return *row.AttemptedAt
}

// finish ends a job's claim: its result is written, or it was handed back.
func (a *Adapter) finish(id int64) {
	a.mu.Lock()
	j, ok := a.jobs[id]
	delete(a.jobs, id)
	a.mu.Unlock()
	if ok {
		j.claim.Done()
		close(j.done)
	}
}

// driver is River's pgx driver with its executor wrapped.
type driver struct {
	riverdriver.Driver[pgx.Tx]
	a *Adapter
}

func (d *driver) GetExecutor() riverdriver.Executor {
	return &executor{Executor: d.Driver.GetExecutor(), a: d.a}
}

// executor is River's executor with the fetch and the completer's write
// seen by the Agent.
type executor struct {
	riverdriver.Executor
	a *Adapter
}

// JobGetAvailable is River's fetch, as a receive of the Agent: after
// stop-claiming it locks nothing; the jobs it locks are held.
func (e *executor) JobGetAvailable(ctx context.Context, params *riverdriver.JobGetAvailableParams) (*riverdriver.JobGetAvailableResult, error) {
	// The claims' parent outlives the fetch: River's pilot runs it under a
	// timeout of its own (HotOperationTimeout), canceled on return.
	r, err := e.a.agent.Receive(context.WithoutCancel(ctx))
	if errors.Is(err, worker.ErrStopping) {
		return &riverdriver.JobGetAvailableResult{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer r.End()
	// The query runs with River's ctx, not r.Context(): stop-claiming must
	// not cut off a fetch that may have locked jobs (worker.Receive.Context);
	// River's own timeout rolls the one statement back.
	res, err := e.Executor.JobGetAvailable(ctx, params)
	if err != nil || res == nil {
		return res, err
	}
	var stale []*job
	e.a.mu.Lock()
	for _, row := range res.Jobs {
		if old, ok := e.a.jobs[row.ID]; ok {
			// An earlier attempt of this job, still worked here, was taken
			// from this client (River's rescuer): its claim is over.
			stale = append(stale, old)
		}
		e.a.jobs[row.ID] = &job{id: row.ID, attempt: row.Attempt, attemptedAt: attemptedAt(row), queue: row.Queue, claim: r.Hold(), done: make(chan struct{})}
	}
	e.a.mu.Unlock()
	for _, old := range stale {
		old.claim.Done()
		close(old.done)
	}
	return res, nil
}

// JobSetStateIfRunningMany is River's completer's write: the results of
// jobs handed back are dropped, and the claims of the jobs written end.
func (e *executor) JobSetStateIfRunningMany(ctx context.Context, params *riverdriver.JobSetStateIfRunningManyParams) ([]*rivertype.JobRow, error) {
	params = e.a.dropHandedBack(params)
	if len(params.ID) == 0 {
		return nil, nil
	}
	rows, err := e.Executor.JobSetStateIfRunningMany(ctx, params)
	if err != nil {
		return rows, err
	}
	for _, id := range params.ID {
		e.a.finish(id)
	}
	return rows, nil
}

// dropHandedBack returns params without the jobs handed back.
func (a *Adapter) dropHandedBack(p *riverdriver.JobSetStateIfRunningManyParams) *riverdriver.JobSetStateIfRunningManyParams {
	a.mu.Lock()
	defer a.mu.Unlock()
	keep := func(i int) bool { _, back := a.handedBack[p.ID[i]]; return !back }
	all := true
	for i := range p.ID {
		all = all && keep(i)
	}
	if all {
		return p
	}
	defer func() {
		for _, id := range p.ID {
			delete(a.handedBack, id)
		}
	}()
	out := &riverdriver.JobSetStateIfRunningManyParams{Now: p.Now, Schema: p.Schema}
	for i := range p.ID {
		if !keep(i) {
			continue
		}
		out.ID = append(out.ID, p.ID[i])
		out.Attempt = append(out.Attempt, p.Attempt[i])
		out.ErrData = append(out.ErrData, p.ErrData[i])
		out.FinalizedAt = append(out.FinalizedAt, p.FinalizedAt[i])
		out.MetadataDoMerge = append(out.MetadataDoMerge, p.MetadataDoMerge[i])
		out.MetadataUpdates = append(out.MetadataUpdates, p.MetadataUpdates[i])
		out.ScheduledAt = append(out.ScheduledAt, p.ScheduledAt[i])
		out.State = append(out.State, p.State[i])
	}
	return out
}

// middleware runs each job's work under its claim.
type middleware struct {
	riverqueue.MiddlewareDefaults
	a *Adapter
}

// Work runs the job with a context that also ends when the claim's ends
// (the "cancel" fallback), when ReturnClaims hands the job back, and when
// Run's context ends. Canceled work that returns an error is snoozed for
// 0 s: available again at once, the attempt not counted.
func (m *middleware) Work(ctx context.Context, row *rivertype.JobRow, doInner func(context.Context) error) error {
	a := m.a
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(context.Canceled)
	a.mu.Lock()
	j, ok := a.jobs[row.ID]
	if ok {
		j.cancel = cancel
		if j.handedBack {
			cancel(errHandedBack)
		}
	}
	if a.leaving {
		cancel(errLeaving)
	}
	a.mu.Unlock()
	if !ok { // not fetched through this adapter (rivertest, a JobCompleteTx test): run as is
		return doInner(ctx)
	}
	stop := context.AfterFunc(j.claim.Context(), func() { cancel(context.Cause(j.claim.Context())) })
	err := doInner(wctx)
	stop()
	a.mu.Lock()
	j.worked = true
	a.mu.Unlock()
	if err != nil && wctx.Err() != nil {
		cause := context.Cause(wctx)
		if errors.Is(cause, worker.ErrCanceled) || errors.Is(cause, errHandedBack) || errors.Is(cause, errLeaving) {
			if errors.Is(cause, worker.ErrCanceled) {
				// Handed back because of the cancel fallback: the next
				// return counts it (docs/protocol.md, "returned").
				a.mu.Lock()
				a.canceledSnoozes++
				a.mu.Unlock()
			}
			return riverqueue.JobSnooze(0)
		}
	}
	return err
}
