// Package redisstreams is the handoff adapter for a Redis Streams consumer
// group (github.com/redis/go-redis/v9; Redis 6.2 or newer, for XAUTOCLAIM).
//
// An Adapter consumes one stream as one consumer of one group and maps the
// protocol's steps onto Redis's own commands:
//
//   - Claiming: Run's claim loops each take up to Config.Batch entries at a
//     time, first those handed back by another worker or idle past
//     Config.VisibilityTimeout (XAUTOCLAIM, min-idle VisibilityTimeout), else
//     new ones (XREADGROUP ">", blocking up to Config.Block). Each entry is
//     held unstarted (worker.Receive.HoldUnstarted), then started, handled
//     and acknowledged (XACK) in turn.
//   - Stop claiming: a blocking XREADGROUP under way is ended from another
//     connection with CLIENT UNBLOCK, which Redis answers as a timeout, with
//     no entry delivered: the read ends at once and claims nothing. An entry
//     the server delivered in the race is in the reply, read to the end, and
//     held. No loop reads again.
//   - Unstarted entries (the rest of a batch) are handed back at
//     stop-claiming (worker.Options.HandBack).
//   - Hand back: Redis has no nack. An entry handed back is moved to the
//     group's consumer Config.ReturnedConsumer with its idle time set to
//     ten years (XCLAIM ... IDLE ... JUSTID, which leaves its delivery count
//     as it is), only if this consumer still owns it (checked in the same
//     Lua script). Any XAUTOCLAIM then takes it at once, whatever its
//     min-idle, and so does any other consumer of the group that
//     autoclaims. The same script adds an entry to the wake stream
//     (Config.WakeStream), which the survivors' claim loops read in the same
//     blocking XREADGROUP as the stream: the one it wakes autoclaims the
//     handed-back entries at once; the others look at the end of their
//     Config.Block. At the drain deadline worker.Options.ReturnClaims hands
//     back every entry pending on this consumer the same way, including
//     entries the worker no longer knows of (from a crash of an earlier
//     process with the same consumer name).
//   - Keep-alive: every VisibilityTimeout/3 the entries held (started or
//     not) are claimed again by this consumer with XCLAIM ... JUSTID, which
//     resets their idle time without counting a delivery, again only if this
//     consumer still owns them. So no XAUTOCLAIM with min-idle
//     VisibilityTimeout takes an entry still being worked, however long the
//     work or the drain lasts.
//
// Delivery is at least once, as with any consumer group: an entry whose
// handler fails is not acknowledged and is claimed again once idle for
// VisibilityTimeout; work still running when ReturnClaims hands its entry
// back may be done twice. Redis Cluster is not supported (the adapter needs
// one connection per claim loop, *redis.Client.Conn).
package redisstreams

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"

	"github.com/handoff-dev/handoff/worker"
)

// Defaults of Config.
const (
	DefaultVisibilityTimeout = 30 * time.Second
	DefaultBlock             = time.Second
	DefaultBatch             = 10
	DefaultReturnedConsumer  = "handoff-returned"
)

// returnedIdle is the idle time an entry handed back gets: more than any
// min-idle an XAUTOCLAIM uses, and less than the time since the Unix epoch
// (Redis resets a larger one to 0).
const returnedIdle = 10 * 365 * 24 * time.Hour

// Bounds of the adapter's own calls, so none waits forever.
const (
	ackTimeout   = 10 * time.Second      // XACK after a handler
	retryWait    = time.Second           // between a failed read and the next
	unblockEvery = 10 * time.Millisecond // CLIENT UNBLOCK, until the read ends
	minTimeout   = 10 * time.Millisecond // the smallest VisibilityTimeout
	maxBlock     = 365 * 24 * time.Hour  // the largest Block (go-redis: 0 would block forever)
)

// Config says which stream, group and consumer an Adapter is, and its
// timings.
type Config struct {
	// Stream is the stream's key. Required.
	Stream string
	// Group is the consumer group. Run creates it, reading from the start
	// of the stream (XGROUP CREATE ... 0 MKSTREAM), if it does not exist.
	// Required.
	Group string
	// Consumer is this worker's consumer name in Group, unique among the
	// group's live workers and stable across restarts of one (the pod
	// name). Required; not ReturnedConsumer.
	Consumer string
	// VisibilityTimeout is how long an entry pending on a consumer that
	// does not keep it alive stays its own: Run takes entries idle longer
	// (XAUTOCLAIM min-idle), and keeps the entries it holds alive every
	// VisibilityTimeout/3. Give every worker of the group the same. Zero:
	// DefaultVisibilityTimeout (30s); else at least 10ms.
	VisibilityTimeout time.Duration
	// Block is the longest one XREADGROUP waits for new entries, and so the
	// longest a claim loop waiting for them takes to see entries handed back
	// by another worker. Zero: DefaultBlock (1s); else from 1ms to a year.
	Block time.Duration
	// Batch is the most entries one claim loop takes at a time (COUNT).
	// Those not started at stop-claiming are handed back then. Zero:
	// DefaultBatch (10).
	Batch int
	// Concurrency is the number of claim loops, each with a connection of
	// its own, each working on one entry at a time. Zero: 1.
	Concurrency int
	// ReturnedConsumer is the consumer entries are handed back to.
	// Zero: DefaultReturnedConsumer ("handoff-returned").
	ReturnedConsumer string
	// WakeStream is the key of the stream a hand-back adds an entry to, so
	// that a claim loop blocked in XREADGROUP wakes and takes the entries at
	// once. Run creates Group on it too; its entries are acknowledged as read
	// and it is trimmed to about 1000 entries. Zero: Stream +
	// ":handoff-wake"; not Stream.
	WakeStream string
}

// Adapter is one consumer of a Redis Streams consumer group, with the
// handoff Agent that hands its entries over. Its methods are safe for
// concurrent use.
type Adapter struct {
	agent *worker.Agent
	rdb   *redis.Client
	cfg   Config
	log   logr.Logger

	mu   sync.Mutex
	held map[string]int // entry ID -> claims held on it: kept alive
}

// New returns an Adapter consuming cfg.Stream through rdb, with an Agent
// made from opts (worker.New) whose HandBack and ReturnClaims are the
// adapter's. It returns an error if opts.HandBack or opts.ReturnClaims is
// set, rdb is nil, a Config field is out of range (naming it and the
// accepted values), or worker.New fails. It does not call Redis.
func New(opts worker.Options, rdb *redis.Client, cfg Config) (*Adapter, error) {
	if opts.HandBack != nil {
		return nil, errors.New("redisstreams: worker.Options.HandBack is set: the adapter hands back unstarted entries itself; leave it nil")
	}
	if opts.ReturnClaims != nil {
		return nil, errors.New("redisstreams: worker.Options.ReturnClaims is set: the adapter returns its pending entries itself; leave it nil")
	}
	if rdb == nil {
		return nil, errors.New("redisstreams: the *redis.Client is nil")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	a := &Adapter{rdb: rdb, cfg: cfg, log: opts.Logger, held: map[string]int{}}
	opts.HandBack = a.handBack
	opts.ReturnClaims = a.returnClaims
	if a.agent, err = worker.New(opts); err != nil {
		return nil, err
	}
	return a, nil
}

// withDefaults checks c and fills in its defaults.
func (c Config) withDefaults() (Config, error) {
	switch {
	case c.Stream == "":
		return c, errors.New("redisstreams: Config.Stream is empty: want the stream's key")
	case c.Group == "":
		return c, errors.New("redisstreams: Config.Group is empty: want the consumer group's name")
	case c.Consumer == "":
		return c, errors.New("redisstreams: Config.Consumer is empty: want this worker's consumer name, like the pod name")
	case c.VisibilityTimeout != 0 && c.VisibilityTimeout < minTimeout:
		return c, fmt.Errorf("redisstreams: Config.VisibilityTimeout %s: want 0 (%s) or at least %s", c.VisibilityTimeout, DefaultVisibilityTimeout, minTimeout)
	case c.Block != 0 && (c.Block < time.Millisecond || c.Block > maxBlock):
		return c, fmt.Errorf("redisstreams: Config.Block %s: want 0 (%s) or from 1ms to %s", c.Block, DefaultBlock, maxBlock)
	case c.Batch < 0:
		return c, fmt.Errorf("redisstreams: Config.Batch %d: want 0 (%d) or more", c.Batch, DefaultBatch)
	case c.Concurrency < 0:
		return c, fmt.Errorf("redisstreams: Config.Concurrency %d: want 0 (1) or more", c.Concurrency)
	}
	if c.VisibilityTimeout == 0 {
		c.VisibilityTimeout = DefaultVisibilityTimeout
	}
	if c.Block == 0 {
		c.Block = DefaultBlock
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	if c.ReturnedConsumer == "" {
		c.ReturnedConsumer = DefaultReturnedConsumer
	}
	if c.WakeStream == "" {
		c.WakeStream = c.Stream + ":handoff-wake"
	}
	if c.WakeStream == c.Stream {
		return c, fmt.Errorf("redisstreams: Config.WakeStream %q is Config.Stream: want another key", c.WakeStream)
	}
	if c.Consumer == c.ReturnedConsumer {
		return c, fmt.Errorf("redisstreams: Config.Consumer %q is Config.ReturnedConsumer, where entries are handed back to: want another name", c.Consumer)
	}
	return c, nil
}

// Agent returns the Agent that serves the handoff sidecar (Agent.Handler).
func (a *Adapter) Agent() *worker.Agent { return a.agent }

// Run creates the group (on Config.Stream and Config.WakeStream) if it
// does not exist, then runs Config.Concurrency
// claim loops calling handle for each entry, one at a time per loop, and
// acknowledges (XACK) the entries handle returns nil for. An entry handle
// fails is left pending, to be claimed again once idle for
// VisibilityTimeout. handle's ctx is the claim's (worker.Claim.Context): it
// ends with ctx and with the sidecar's "cancel" fallback.
//
// Run returns nil once claiming has stopped and the loops' claims are done
// (entries handed back at stop-claiming need not be), ctx's error once ctx
// ends (claims left pending are this consumer's until ReturnClaims or
// their visibility timeout), or the error of creating the group.
// Failed reads are logged and retried every second.
func (a *Adapter) Run(ctx context.Context, handle func(ctx context.Context, msg redis.XMessage) error) error {
	for _, key := range []string{a.cfg.Stream, a.cfg.WakeStream} {
		err := a.rdb.XGroupCreateMkStream(ctx, key, a.cfg.Group, "0").Err()
		if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
			return fmt.Errorf("redisstreams: create group %s of stream %s: %w", a.cfg.Group, key, err)
		}
	}
	keepCtx, stopKeep := context.WithCancel(ctx)
	kept := make(chan struct{})
	go func() { defer close(kept); a.keepAliveLoop(keepCtx) }()
	var loops sync.WaitGroup
	for range a.cfg.Concurrency {
		loops.Add(1)
		go func() { defer loops.Done(); a.claimLoop(ctx, handle) }()
	}
	loops.Wait()
	stopKeep()
	<-kept
	select {
	case <-a.agent.Stopping():
		return nil
	default:
		return ctx.Err()
	}
}

// claimLoop receives batches and works them in turn until claiming stops
// or ctx ends.
func (a *Adapter) claimLoop(ctx context.Context, handle func(context.Context, redis.XMessage) error) {
	rd := &reader{a: a, cursor: "0-0"}
	defer rd.close()
	for {
		r, err := a.agent.Receive(ctx)
		if err != nil { // worker.ErrStopping, or ctx ended
			return
		}
		msgs, err := rd.receive(ctx, r.Context())
		if err != nil {
			if ctx.Err() == nil {
				a.log.Error(err, "read entries failed", "stream", a.cfg.Stream, "group", a.cfg.Group)
			}
			sleep(r.Context(), retryWait)
		}
		if len(msgs) == 0 {
			r.End()
			continue
		}
		claims := make([]*worker.Claim, len(msgs))
		for i, m := range msgs {
			a.track(m.ID, 1)
			claims[i] = r.HoldUnstarted(m.ID)
		}
		r.End()
		for i, c := range claims {
			if c.Start() != nil { // worker.ErrHandedBack: handBack has it
				continue
			}
			a.work(ctx, c, msgs[i], handle)
		}
	}
}

// work handles one started claim, acknowledges its entry if handle
// succeeded, and ends the claim.
func (a *Adapter) work(ctx context.Context, c *worker.Claim, m redis.XMessage, handle func(context.Context, redis.XMessage) error) {
	defer c.Done()
	defer a.track(m.ID, -1)
	if err := handle(c.Context(), m); err != nil {
		a.log.Info("handler failed; entry left pending", "id", m.ID, "error", err.Error())
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	if err := a.rdb.XAck(actx, a.cfg.Stream, a.cfg.Group, m.ID).Err(); err != nil {
		a.log.Error(err, "XACK failed; entry left pending", "id", m.ID)
	}
}

// track counts one more (n 1) or one fewer (n -1) claim held on entry id.
func (a *Adapter) track(id string, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held[id] += n
	if a.held[id] <= 0 {
		delete(a.held, id)
	}
}

// reader is one claim loop's way in: its own connection, for the blocking
// read that CLIENT UNBLOCK ends, and its XAUTOCLAIM cursor.
type reader struct {
	a      *Adapter
	conn   *redis.Conn
	id     int64  // the connection's CLIENT ID
	cursor string // where the next XAUTOCLAIM starts
}

func (rd *reader) close() {
	if rd.conn != nil {
		_ = rd.conn.Close()
		rd.conn = nil
	}
}

// receive returns entries now this consumer's: first those handed back or
// idle past the visibility timeout, else new ones, waiting up to
// Config.Block for them or until wait ends (stop-claiming), whichever is
// first. The commands run with ctx, so an entry Redis delivered is never
// dropped: wait ends the blocking read only through CLIENT UNBLOCK.
func (rd *reader) receive(ctx, wait context.Context) ([]redis.XMessage, error) {
	a := rd.a
	msgs, next, err := a.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: a.cfg.Stream, Group: a.cfg.Group, Consumer: a.cfg.Consumer,
		MinIdle: a.cfg.VisibilityTimeout, Start: rd.cursor, Count: int64(a.cfg.Batch),
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("XAUTOCLAIM: %w", err)
	}
	rd.cursor = next
	if len(msgs) > 0 || wait.Err() != nil {
		return msgs, nil
	}
	if rd.conn == nil {
		rd.conn = a.rdb.Conn()
		if rd.id, err = rd.conn.ClientID(ctx).Result(); err != nil {
			rd.close()
			return nil, fmt.Errorf("CLIENT ID: %w", err)
		}
	}
	// Once wait ends, unblock the read until it has ended: a CLIENT
	// UNBLOCK that comes before the read blocks does nothing.
	read, unblocked := make(chan struct{}), make(chan struct{})
	stop := context.AfterFunc(wait, func() {
		defer close(unblocked)
		for {
			_ = a.rdb.ClientUnblock(ctx, rd.id).Err()
			select {
			case <-read:
				return
			case <-ctx.Done():
				return
			case <-time.After(unblockEvery):
			}
		}
	})
	streams, err := rd.conn.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: a.cfg.Group, Consumer: a.cfg.Consumer, Streams: []string{a.cfg.Stream, a.cfg.WakeStream, ">", ">"},
		Count: int64(a.cfg.Batch), Block: a.cfg.Block,
	}).Result()
	close(read)
	if !stop() {
		<-unblocked // the next read must not be unblocked
	}
	switch {
	case errors.Is(err, redis.Nil): // Block passed, or unblocked
		return nil, nil
	case err != nil:
		rd.close() // a new connection, and CLIENT ID, next time
		return nil, fmt.Errorf("XREADGROUP: %w", err)
	}
	for _, s := range streams {
		if s.Stream != a.cfg.WakeStream {
			msgs = append(msgs, s.Messages...)
			continue
		}
		// Entries were handed back: look from the start of the PEL next.
		rd.cursor = "0-0"
		ids := make([]string, len(s.Messages))
		for i, m := range s.Messages {
			ids[i] = m.ID
		}
		if err := a.rdb.XAck(ctx, a.cfg.WakeStream, a.cfg.Group, ids...).Err(); err != nil {
			return msgs, fmt.Errorf("XACK of the wake stream: %w", err)
		}
	}
	return msgs, nil
}

// keepAliveLoop keeps the entries held alive every VisibilityTimeout/3
// until ctx ends.
func (a *Adapter) keepAliveLoop(ctx context.Context) {
	every := a.cfg.VisibilityTimeout / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		a.mu.Lock()
		ids := make([]any, 0, len(a.held))
		for id := range a.held {
			ids = append(ids, id)
		}
		a.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		kctx, cancel := context.WithTimeout(ctx, every)
		err := keepAliveScript.Run(kctx, a.rdb, []string{a.cfg.Stream}, append([]any{a.cfg.Group, a.cfg.Consumer}, ids...)...).Err()
		cancel()
		if err != nil && ctx.Err() == nil {
			a.log.Error(err, "keep-alive failed", "entries", len(ids))
		}
	}
}

// handBack is the Agent's HandBack: it hands back the unstarted entries
// still this consumer's.
func (a *Adapter) handBack(ctx context.Context, claims []*worker.Claim) error {
	args := []any{a.cfg.Group, a.cfg.Consumer, a.cfg.ReturnedConsumer, returnedIdle.Milliseconds()}
	ids := make([]string, len(claims))
	for i, c := range claims {
		ids[i] = c.Value().(string)
		args = append(args, ids[i])
	}
	n, err := handBackScript.Run(ctx, a.rdb, []string{a.cfg.Stream, a.cfg.WakeStream}, args...).Int()
	if err != nil {
		return fmt.Errorf("redisstreams: hand back %d entries: %w", len(ids), err)
	}
	for _, id := range ids {
		a.track(id, -1)
	}
	a.log.Info("handed back", "count", n, "ids", ids)
	return nil
}

// returnClaims is the Agent's ReturnClaims: it hands back every entry
// pending on this consumer.
func (a *Adapter) returnClaims(ctx context.Context) (int, error) {
	n, err := returnAllScript.Run(ctx, a.rdb, []string{a.cfg.Stream, a.cfg.WakeStream},
		a.cfg.Group, a.cfg.Consumer, a.cfg.ReturnedConsumer, returnedIdle.Milliseconds()).Int()
	if err != nil {
		return 0, fmt.Errorf("redisstreams: return pending entries of consumer %s: %w", a.cfg.Consumer, err)
	}
	// None is this consumer's now: keep none alive (the keep-alive would
	// skip them anyway), including unstarted ones HandBack failed on.
	a.mu.Lock()
	clear(a.held)
	a.mu.Unlock()
	return n, nil
}

// The scripts check who owns an entry and claim it in one step, so that an
// entry another consumer took in between is left to it.
var (
	// keepAliveScript resets the idle time of the entries ARGV[3:] still
	// pending on consumer ARGV[2] of group ARGV[1] of stream KEYS[1], and
	// says how many.
	keepAliveScript = redis.NewScript(`
local n = 0
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    n = n + 1
  end
end
return n`)
	// handBackScript moves the entries ARGV[5:] still pending on consumer
	// ARGV[2] to consumer ARGV[3] with idle time ARGV[4] ms, adds an entry
	// to the wake stream KEYS[2] if it moved any, and says how many.
	handBackScript = redis.NewScript(`
local n = 0
for i = 5, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[i], 'IDLE', ARGV[4], 'JUSTID')
    n = n + 1
  end
end
if n > 0 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'returned', n)
end
return n`)
	// returnAllScript moves every entry pending on consumer ARGV[2] to
	// consumer ARGV[3] with idle time ARGV[4] ms, adds an entry to the wake
	// stream KEYS[2] if it moved any, and says how many.
	// Entries deleted from the stream leave the PEL on XCLAIM and are not
	// counted. It pages through the PEL in ID order (exclusive start,
	// Redis 6.2), so it ends.
	returnAllScript = redis.NewScript(`
local n, from = 0, '-'
while true do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], from, '+', 100, ARGV[2])
  if #p == 0 then
    if n > 0 then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'returned', n)
    end
    return n
  end
  local args = {KEYS[1], ARGV[1], ARGV[3], 0}
  for _, e in ipairs(p) do args[#args + 1] = e[1] end
  from = '(' .. p[#p][1]
  args[#args + 1] = 'IDLE'
  args[#args + 1] = ARGV[4]
  args[#args + 1] = 'JUSTID'
  n = n + #redis.call('XCLAIM', unpack(args))
end`)
)

// sleep waits for d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
