// Package queue is a work queue in PostgreSQL with visibility-timeout
// claims, the kind of queue the pgworker example drains with handoff.
//
// A claim hides a message for a visibility timeout; if the claimer neither
// completes nor returns it in time, it becomes visible again and another
// worker gets it (a redelivery). Complete is idempotent by dedup key, so a
// redelivered message takes effect once. Every claim, completion and return
// is also recorded in handoff_deliveries, and Check verifies the whole
// history: nothing lost, nothing applied twice, no leader job run with a
// stale fencing token.
//
// Tables (created by Migrate):
//
//	handoff_queue        messages not yet completed
//	handoff_enqueued     every message ever enqueued: dedup key and amount
//	handoff_processed    dedup keys completed, by message and worker
//	handoff_totals       the effect of completions: total of their amounts
//	handoff_fence        highest fencing token seen, by Lease
//	handoff_leader_runs  every leader job run
//	handoff_deliveries   every claim, completion and return
package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrStaleFencingToken is returned by RunLeaderJob when a leader with a
// newer fencing token has already run the job.
var ErrStaleFencingToken = errors.New("queue: stale fencing token")

// Delivery outcomes recorded in handoff_deliveries.
const (
	OutcomeClaimed    = "claimed"
	OutcomeApplied    = "applied"
	OutcomeDuplicate  = "duplicate"
	OutcomeReturned   = "returned"    // handed back by ReturnClaims (the drain deadline)
	OutcomeHandedBack = "handed-back" // handed back unstarted by HandBack (stop-claiming)
)

// schema is idempotent: every statement may run on an existing database.
const schema = `
CREATE TABLE IF NOT EXISTS handoff_queue (
	id          bigserial PRIMARY KEY,
	dedup_key   text UNIQUE NOT NULL,
	amount      bigint NOT NULL,
	work_ms     int NOT NULL DEFAULT 0,
	enqueued_at timestamptz DEFAULT now(),
	visible_at  timestamptz NOT NULL DEFAULT now(),
	claimed_by  text,
	claimed_at  timestamptz,
	deliveries  int NOT NULL DEFAULT 0
);
-- The shard of a message (a shard Lease's name); NULL: not sharded.
ALTER TABLE handoff_queue ADD COLUMN IF NOT EXISTS shard text;
CREATE INDEX IF NOT EXISTS handoff_queue_shard ON handoff_queue (shard, id);
-- Claims take messages in the order they became visible (claim).
CREATE INDEX IF NOT EXISTS handoff_queue_visible ON handoff_queue (shard, visible_at, id);
CREATE TABLE IF NOT EXISTS handoff_enqueued (
	dedup_key text PRIMARY KEY,
	amount    bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS handoff_processed (
	dedup_key  text PRIMARY KEY,
	message_id bigint,
	worker     text,
	applied_at timestamptz DEFAULT now()
);
CREATE TABLE IF NOT EXISTS handoff_totals (
	name  text PRIMARY KEY,
	total bigint NOT NULL
);
INSERT INTO handoff_totals (name, total) VALUES ('total', 0) ON CONFLICT (name) DO NOTHING;
CREATE TABLE IF NOT EXISTS handoff_fence (
	lease text PRIMARY KEY,
	token bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS handoff_leader_runs (
	id     bigserial PRIMARY KEY,
	lease  text,
	token  bigint,
	holder text,
	ran_at timestamptz DEFAULT clock_timestamp()
);
-- The end of the writer's term as it was told ("leader until T"); NULL
-- when not given (RunLeaderJob).
ALTER TABLE handoff_leader_runs ADD COLUMN IF NOT EXISTS until_at timestamptz;
-- A NOTIFY on VisibleChannel when a statement makes messages visible at
-- once (enqueued, handed back, returned), not when it claims them: idle
-- claim loops (Listen) claim again without waiting for their next poll.
CREATE OR REPLACE FUNCTION handoff_queue_notify_visible() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM handoff_visible_rows WHERE claimed_by IS NULL AND visible_at <= now()) THEN
		PERFORM pg_notify('handoff_queue_visible', '');
	END IF;
	RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER handoff_queue_visible_insert AFTER INSERT ON handoff_queue
	REFERENCING NEW TABLE AS handoff_visible_rows FOR EACH STATEMENT EXECUTE FUNCTION handoff_queue_notify_visible();
CREATE OR REPLACE TRIGGER handoff_queue_visible_update AFTER UPDATE ON handoff_queue
	REFERENCING NEW TABLE AS handoff_visible_rows FOR EACH STATEMENT EXECUTE FUNCTION handoff_queue_notify_visible();
CREATE TABLE IF NOT EXISTS handoff_deliveries (
	id         bigserial PRIMARY KEY,
	message_id bigint,
	worker     text,
	outcome    text,
	at         timestamptz DEFAULT clock_timestamp()
);
`

// Migrate creates the queue's tables if they do not exist. Workers starting
// together may all call it: a transaction-scoped advisory lock runs one
// migration at a time.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('handoff_queue_migrate'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schema)
		return err
	})
	if err != nil {
		return fmt.Errorf("queue: migrate: %w", err)
	}
	return nil
}

// Message is a unit of work.
type Message struct {
	// DedupKey identifies the message for deduplication: enqueued at most
	// once, applied at most once.
	DedupKey string
	// Amount is what applying the message adds to the total.
	Amount int64
	// WorkMillis is how long, in milliseconds, the work takes.
	WorkMillis int
	// Shard is the message's shard key: the name of the shard Lease whose
	// holder works it (ClaimShard); "" for a message of no shard, which
	// only Claim and ClaimBatch claim.
	Shard string
}

// Claimed is a message claimed by a worker.
type Claimed struct {
	ID int64
	Message
	// Deliveries counts the claims of this message, this one included; more
	// than 1 is a redelivery.
	Deliveries int
	// VisibleAt is when the claim expires and the message is visible to
	// other workers again.
	VisibleAt time.Time
}

// Enqueue adds msgs to the queue in one statement, in order. A message
// whose dedup key was enqueued before (now or in an earlier call) is
// skipped, so a producer may retry.
func Enqueue(ctx context.Context, pool *pgxpool.Pool, msgs []Message) error {
	keys := make([]string, len(msgs))
	amounts := make([]int64, len(msgs))
	works := make([]int32, len(msgs))
	shards := make([]string, len(msgs))
	for i, m := range msgs {
		keys[i], amounts[i], works[i], shards[i] = m.DedupKey, m.Amount, int32(m.WorkMillis), m.Shard
	}
	_, err := pool.Exec(ctx, `
WITH input AS (
	SELECT DISTINCT ON (dedup_key) dedup_key, amount, work_ms, NULLIF(shard, '') AS shard, n
	FROM unnest($1::text[], $2::bigint[], $3::int[], $4::text[]) WITH ORDINALITY AS t(dedup_key, amount, work_ms, shard, n)
	ORDER BY dedup_key, n
), fresh AS (
	INSERT INTO handoff_enqueued (dedup_key, amount)
	SELECT dedup_key, amount FROM input
	ON CONFLICT (dedup_key) DO NOTHING
	RETURNING dedup_key
)
INSERT INTO handoff_queue (dedup_key, amount, work_ms, shard)
SELECT i.dedup_key, i.amount, i.work_ms, i.shard FROM input i JOIN fresh USING (dedup_key)
ORDER BY i.n`, keys, amounts, works, shards)
	if err != nil {
		return fmt.Errorf("queue: enqueue %d messages: %w", len(msgs), err)
	}
	return nil
}

// Claim claims the visible message that has waited longest for worker and
// hides it from other workers for visibility (rounded to microseconds).
// Concurrent claimers skip each other's locked rows, so they get different
// messages. It returns nil, nil when no message is visible.
//
// The order of claims: a message waits from when it became visible, which
// is its enqueue, or the moment its last claim expired or it was handed
// back or returned; the longest waiting is claimed first, then the lowest
// id. So a message whose claims keep expiring (a poison message, or a
// visibility timeout shorter than the work) goes behind every message
// already waiting each time and never holds them back. Nothing more is
// promised: concurrent claimers skip rows locked by each other, so one may
// take a later message before an earlier one, and a message is not claimed
// before its visibility timeout has run out.
func Claim(ctx context.Context, pool *pgxpool.Pool, worker string, visibility time.Duration) (*Claimed, error) {
	cs, err := ClaimBatch(ctx, pool, worker, visibility, 1)
	if err != nil || len(cs) == 0 {
		return nil, err
	}
	return cs[0], nil
}

// ClaimBatch claims up to n (1 or more) of the visible messages that have
// waited longest for worker in one statement, in Claim's order, and returns
// them in that order; none when no message is visible. Every one is hidden for
// visibility from now, so a worker that starts them in turn hands back
// those it has not started when it stops (HandBack) rather than let them
// wait out the timeout.
func ClaimBatch(ctx context.Context, pool *pgxpool.Pool, worker string, visibility time.Duration, n int) ([]*Claimed, error) {
	return claim(ctx, pool, worker, "", visibility, n)
}

// ClaimShard claims up to n (1 or more) of the visible messages of shard
// that have waited longest for worker, in Claim's order, as ClaimBatch does
// for the messages of no shard. Call it only while leading shard
// (worker.Agent.BeginLeading of that shard Lease), and complete with
// CompleteFenced and that term's fencing token.
func ClaimShard(ctx context.Context, pool *pgxpool.Pool, worker, shard string, visibility time.Duration, n int) ([]*Claimed, error) {
	if shard == "" {
		return nil, errors.New("queue: claim of a shard: want a shard name")
	}
	return claim(ctx, pool, worker, shard, visibility, n)
}

// claim claims up to n messages of shard ("": of no shard).
func claim(ctx context.Context, pool *pgxpool.Pool, worker, shard string, visibility time.Duration, n int) ([]*Claimed, error) {
	if n < 1 {
		return nil, fmt.Errorf("queue: claim a batch of %d: want 1 or more", n)
	}
	// The rows to claim are picked once, in a materialized CTE. As a
	// subquery (WHERE id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)),
	// a plan that runs it again for each row of the update (a nested loop)
	// skips the rows the update has just claimed and picks others each
	// time: the statement claimed every visible message, not n (seen in an
	// e2e run once the table had grown; TestClaimTakesNoMoreThanItsBatch).
	rows, err := pool.Query(ctx, `
WITH picked AS MATERIALIZED (
	SELECT id, visible_at AS waited FROM handoff_queue
	WHERE visible_at <= now() AND shard IS NOT DISTINCT FROM NULLIF($4, '')
	ORDER BY visible_at, id
	FOR UPDATE SKIP LOCKED
	LIMIT $3
), c AS (
	UPDATE handoff_queue q
	SET claimed_by = $1, claimed_at = now(),
		visible_at = now() + $2::bigint * interval '1 microsecond',
		deliveries = q.deliveries + 1
	FROM picked
	WHERE q.id = picked.id
	RETURNING q.id, q.dedup_key, q.amount, q.work_ms, coalesce(q.shard, '') AS shard, q.deliveries, q.visible_at, picked.waited
), d AS (
	INSERT INTO handoff_deliveries (message_id, worker, outcome)
	SELECT id, $1, 'claimed' FROM c
)
SELECT id, dedup_key, amount, work_ms, shard, deliveries, visible_at FROM c ORDER BY waited, id`,
		worker, visibility.Microseconds(), n, shard)
	if err != nil {
		return nil, fmt.Errorf("queue: claim: %w", err)
	}
	cs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Claimed, error) {
		var c Claimed
		err := row.Scan(&c.ID, &c.DedupKey, &c.Amount, &c.WorkMillis, &c.Shard, &c.Deliveries, &c.VisibleAt)
		return &c, err
	})
	if err != nil {
		return nil, fmt.Errorf("queue: claim: %w", err)
	}
	return cs, nil
}

// Renew keeps worker's claim c: the message is hidden for visibility from
// now. It is fenced by the delivery, as HandBack is: it returns false, and
// changes nothing, when the message was claimed again since (its visibility
// timeout ran out and another worker, or this one, claimed it), completed,
// or handed back. A worker calls it before it starts a message it claimed
// earlier in a batch: one that waited past its visibility timeout may be
// another worker's by then, and must not be worked twice at once.
func Renew(ctx context.Context, pool *pgxpool.Pool, worker string, c *Claimed, visibility time.Duration) (bool, error) {
	tag, err := pool.Exec(ctx, `
UPDATE handoff_queue SET visible_at = now() + $4::bigint * interval '1 microsecond'
WHERE id = $1 AND claimed_by = $2 AND deliveries = $3`, c.ID, worker, c.Deliveries, visibility.Microseconds())
	if err != nil {
		return false, fmt.Errorf("queue: renew the claim of message %d: %w", c.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// HandBack hands back claims worker made and has not started, in one
// statement: each message becomes visible (and claimable) at once. It is
// fenced by the delivery: a message claimed again since (by another worker
// after its visibility timeout, or by worker itself), completed, or
// already handed back is not touched. It records a "handed-back" delivery
// (OutcomeHandedBack) for each message handed back and returns how many
// there were.
func HandBack(ctx context.Context, pool *pgxpool.Pool, worker string, claims []*Claimed) (int, error) {
	ids := make([]int64, len(claims))
	deliveries := make([]int32, len(claims))
	for i, c := range claims {
		ids[i], deliveries[i] = c.ID, int32(c.Deliveries)
	}
	var n int
	err := pool.QueryRow(ctx, `
WITH r AS (
	UPDATE handoff_queue q SET visible_at = now(), claimed_by = NULL
	FROM unnest($2::bigint[], $3::int[]) AS h(id, deliveries)
	WHERE q.id = h.id AND q.deliveries = h.deliveries AND q.claimed_by = $1
	RETURNING q.id
), d AS (
	INSERT INTO handoff_deliveries (message_id, worker, outcome)
	SELECT id, $1, 'handed-back' FROM r
)
SELECT count(*) FROM r`, worker, ids, deliveries).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("queue: hand back %d claims of %s: %w", len(claims), worker, err)
	}
	return n, nil
}

// Complete is the idempotent commit of the work on c, in one transaction:
// it records c's dedup key as processed and, only if it was not processed
// before, adds c.Amount to the total; it deletes the message and records
// the delivery as "applied" or "duplicate". applied is false for a
// duplicate: a redelivered message whose effect is already there.
//
// Complete does not check that worker still holds the claim: a worker whose
// claim expired may still complete, and the worker that claimed the message
// next then completes a duplicate. It locks the message's row first, so a
// ReturnClaims under way either hands the message back before the effect
// is written or finds it gone: a hand-back at the drain deadline never
// makes a message visible again while its completion commits.
func Complete(ctx context.Context, pool *pgxpool.Pool, worker string, c *Claimed) (applied bool, err error) {
	return complete(ctx, pool, worker, c, nil)
}

// CompleteFenced is Complete for a message of a shard, fenced by token, the
// fencing token of the term in which worker leads c.Shard: in the same
// transaction it raises the shard's highest seen token to token, and if a
// higher one was seen already (a later holder of the shard has completed
// one of its messages) it writes nothing and returns ErrStaleFencingToken.
// An equal token (the same term) passes.
func CompleteFenced(ctx context.Context, pool *pgxpool.Pool, worker string, c *Claimed, token int64) (applied bool, err error) {
	if c.Shard == "" {
		return false, fmt.Errorf("queue: fenced completion of message %d: it has no shard", c.ID)
	}
	applied, err = complete(ctx, pool, worker, c, func(tx pgx.Tx) error {
		return fence(ctx, tx, c.Shard, token)
	})
	if errors.Is(err, ErrStaleFencingToken) {
		return false, fmt.Errorf("completion of message %d of shard %s by %s with token %d: %w", c.ID, c.Shard, worker, token, ErrStaleFencingToken)
	}
	return applied, err
}

// fence raises the highest token seen for lease to token in tx, or returns
// ErrStaleFencingToken when a higher one was seen.
func fence(ctx context.Context, tx pgx.Tx, lease string, token int64) error {
	var seen int64
	err := tx.QueryRow(ctx, `
INSERT INTO handoff_fence (lease, token) VALUES ($1, $2)
ON CONFLICT (lease) DO UPDATE SET token = EXCLUDED.token
WHERE handoff_fence.token <= EXCLUDED.token
RETURNING token`, lease, token).Scan(&seen)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrStaleFencingToken
	}
	return err
}

// complete is Complete with fenced, if not nil, run first in the
// transaction: its error rolls the completion back.
func complete(ctx context.Context, pool *pgxpool.Pool, worker string, c *Claimed, fenced func(pgx.Tx) error) (applied bool, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if fenced != nil {
			if err := fenced(tx); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `SELECT 1 FROM handoff_queue WHERE id = $1 FOR UPDATE`, c.ID); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `
INSERT INTO handoff_processed (dedup_key, message_id, worker) VALUES ($1, $2, $3)
ON CONFLICT (dedup_key) DO NOTHING`, c.DedupKey, c.ID, worker)
		if err != nil {
			return err
		}
		applied = tag.RowsAffected() == 1
		outcome := OutcomeDuplicate
		if applied {
			outcome = OutcomeApplied
			if _, err := tx.Exec(ctx, `UPDATE handoff_totals SET total = total + $1 WHERE name = 'total'`, c.Amount); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM handoff_queue WHERE id = $1`, c.ID); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO handoff_deliveries (message_id, worker, outcome) VALUES ($1, $2, $3)`, c.ID, worker, outcome)
		return err
	})
	if errors.Is(err, ErrStaleFencingToken) {
		return false, err
	}
	if err != nil {
		return false, fmt.Errorf("queue: complete message %d: %w", c.ID, err)
	}
	return applied, nil
}

// ReturnClaims hands back every claim worker holds: the messages become
// visible at once. It records a "returned" delivery for each and returns
// how many there were. Safe to call more than once.
func ReturnClaims(ctx context.Context, pool *pgxpool.Pool, worker string) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `
WITH r AS (
	UPDATE handoff_queue SET visible_at = now(), claimed_by = NULL
	WHERE claimed_by = $1
	RETURNING id
), d AS (
	INSERT INTO handoff_deliveries (message_id, worker, outcome)
	SELECT id, $1, 'returned' FROM r
)
SELECT count(*) FROM r`, worker).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("queue: return claims of %s: %w", worker, err)
	}
	return n, nil
}

// RunLeaderJob runs the periodic leader-only job: it records a run of
// holder, leader of lease with fencing token token, in handoff_leader_runs.
// It is fenced: in the same transaction it raises the lease's highest seen
// token to token, and if a higher token was seen already it writes nothing
// and returns ErrStaleFencingToken. An equal token (the same term) passes.
func RunLeaderJob(ctx context.Context, pool *pgxpool.Pool, lease string, token int64, holder string) error {
	return RunLeaderJobUntil(ctx, pool, lease, token, holder, time.Time{})
}

// RunLeaderJobUntil is RunLeaderJob that also records until, the end of
// holder's term as it was told (worker.Leadership.Until), in the run's
// until_at; the zero time records NULL. A history checker holds each run
// to its term: ran_at not after until_at.
func RunLeaderJobUntil(ctx context.Context, pool *pgxpool.Pool, lease string, token int64, holder string, until time.Time) error {
	var untilAt *time.Time
	if !until.IsZero() {
		untilAt = &until
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fence(ctx, tx, lease, token); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO handoff_leader_runs (lease, token, holder, until_at) VALUES ($1, $2, $3, $4)`, lease, token, holder, untilAt)
		return err
	})
	if errors.Is(err, ErrStaleFencingToken) {
		// The sentinel says "queue:" already.
		return fmt.Errorf("leader job of %s on lease %s with token %d: %w", holder, lease, token, err)
	}
	if err != nil {
		return fmt.Errorf("queue: leader job of %s on lease %s: %w", holder, lease, err)
	}
	return nil
}

// Report is what Check found. Counts are of messages unless said otherwise.
type Report struct {
	// Enqueued counts every message ever enqueued.
	Enqueued int64
	// Applied counts the messages completed (their dedup keys processed).
	Applied int64
	// Pending counts the messages still in the queue, claimed or not.
	Pending int64
	// Duplicates counts the completions skipped as duplicates (deliveries,
	// not messages).
	Duplicates int64
	// Redeliveries counts the messages claimed more than once.
	Redeliveries int64
	// Total is the effect of the completions: the sum of their amounts.
	Total int64
	// WantTotal is the sum of the amounts of every message ever enqueued.
	WantTotal int64
	// PendingTotal is the sum of the amounts of the pending messages; with
	// nothing lost or applied twice, Total + PendingTotal == WantTotal.
	PendingTotal int64
	// LeaderRuns counts the leader job runs.
	LeaderRuns int64
	// StaleLeaderRuns counts the leader job runs, in order of time, whose
	// fencing token is lower than that of an earlier run on the same Lease.
	StaleLeaderRuns int64
}

// Check reads the queue's history and returns the Report; Report.Err says
// whether anything went wrong. Run it when no worker is busy, or it may
// see a completion half done.
func Check(ctx context.Context, pool *pgxpool.Pool) (Report, error) {
	var r Report
	err := pool.QueryRow(ctx, `
SELECT
	(SELECT count(*) FROM handoff_enqueued),
	(SELECT count(*) FROM handoff_processed),
	(SELECT count(*) FROM handoff_queue),
	(SELECT count(*) FROM handoff_deliveries WHERE outcome = 'duplicate'),
	(SELECT count(*) FROM (
		SELECT message_id FROM handoff_deliveries WHERE outcome = 'claimed'
		GROUP BY message_id HAVING count(*) > 1
		UNION
		SELECT id FROM handoff_queue WHERE deliveries > 1
	) AS redelivered),
	(SELECT total FROM handoff_totals WHERE name = 'total'),
	(SELECT coalesce(sum(amount), 0) FROM handoff_enqueued)::bigint,
	(SELECT coalesce(sum(amount), 0) FROM handoff_queue)::bigint,
	(SELECT count(*) FROM handoff_leader_runs),
	(SELECT count(*) FROM (
		SELECT token, max(token) OVER (
			PARTITION BY lease ORDER BY ran_at, id
			ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
		) AS earlier
		FROM handoff_leader_runs
	) AS runs WHERE token < earlier)`,
	).Scan(&r.Enqueued, &r.Applied, &r.Pending, &r.Duplicates, &r.Redeliveries,
		&r.Total, &r.WantTotal, &r.PendingTotal, &r.LeaderRuns, &r.StaleLeaderRuns)
	if err != nil {
		return Report{}, fmt.Errorf("queue: check: %w", err)
	}
	return r, nil
}

// Err says what is wrong, or returns nil: messages lost (neither applied nor
// pending), effects applied twice or missing (Total + PendingTotal !=
// WantTotal), leader runs with a stale fencing token. Pending messages and
// redeliveries alone are not errors.
func (r Report) Err() error {
	var errs []error
	if r.Applied+r.Pending != r.Enqueued {
		errs = append(errs, fmt.Errorf("lost messages: %d enqueued, but %d applied + %d pending = %d",
			r.Enqueued, r.Applied, r.Pending, r.Applied+r.Pending))
	}
	if r.Total+r.PendingTotal != r.WantTotal {
		what := "double effects"
		if r.Total+r.PendingTotal < r.WantTotal {
			what = "missing effects"
		}
		errs = append(errs, fmt.Errorf("%s: total is %d, want %d (%d enqueued - %d pending)",
			what, r.Total, r.WantTotal-r.PendingTotal, r.WantTotal, r.PendingTotal))
	}
	if r.StaleLeaderRuns > 0 {
		errs = append(errs, fmt.Errorf("stale leader runs: %d of %d leader job runs had a fencing token lower than an earlier run's",
			r.StaleLeaderRuns, r.LeaderRuns))
	}
	return errors.Join(errs...)
}

// String summarises r on one line.
func (r Report) String() string {
	return fmt.Sprintf("enqueued=%d applied=%d pending=%d duplicates=%d redeliveries=%d total=%d want=%d pendingTotal=%d leaderRuns=%d staleLeaderRuns=%d",
		r.Enqueued, r.Applied, r.Pending, r.Duplicates, r.Redeliveries, r.Total, r.WantTotal, r.PendingTotal, r.LeaderRuns, r.StaleLeaderRuns)
}
