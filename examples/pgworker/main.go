// Command pgworker is a queue worker that drains a PostgreSQL queue (package
// queue) and hands over cleanly with the handoff sidecar, through
// worker.Agent:
//
//   - --concurrency claim loops each Receive (poll the table every
//     --poll-interval, and at once when a NOTIFY says messages became
//     visible (queue.Listen), until up to --batch messages are claimed in one
//     statement), HoldUnstarted each, then Start, work, Complete and Done
//     them one at a time. Stop-claiming ends the wait between polls at
//     once, the next Receive refuses, and the loops end; a message claimed
//     by a poll under way at stop-claiming is held, and finished or handed
//     back.
//   - At stop-claiming the Agent hands back the messages of a batch not
//     yet started (HandBack: queue.HandBack, one statement, fenced by the
//     delivery), so other workers claim them at once; Start refuses them
//     and the loop skips them. Only the started ones drain.
//   - The sidecar calls ReturnClaims (queue.ReturnClaims for this worker)
//     at the drain deadline, so unfinished messages are visible again at
//     once instead of after the visibility timeout.
//   - With --lease, the leader of that Lease runs a fenced leader job every
//     --leader-interval, passing its fencing token to PostgreSQL.
//   - With --shards (the pod's handoff.dev/shards), it claims only messages
//     of the shards it leads: one claim loop per shard, each claiming while
//     BeginLeading of its shard holds (queue.ClaimShard), completing fenced
//     by that shard's token (queue.CompleteFenced), and, when the sidecar
//     revokes the shard (shed to another pod, or the pod leaving), handing
//     back what it has not started and finishing what it has before the
//     revoke is acknowledged and the Lease freed. --concurrency is unused.
//   - With --without-handoff it runs as a worker without the sidecar does,
//     for baselines: it holds --lease itself with client-go's leader
//     election and, on a signal, just exits, leaving its claims to their
//     visibility timeout and the Lease to its lease duration.
//
// On SIGTERM or SIGINT it exits at once without waiting for work: by then
// the sidecar's preStop has stopped claiming and handed the rest back.
//
// It logs JSON lines to stderr, with "ts" (RFC 3339, nanoseconds), "msg",
// and "worker". The messages a timeline is built from: "claimed" (id,
// dedupKey), "applied" and "duplicate" (id), "handed back" (count, ids: unstarted
// messages handed back at stop-claiming), "returned" (count), "leader
// job" (lease, token) and, from the Agent, "stop claiming".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// exitGrace is how long, after a signal, the worker waits for its loops to
// end before it exits anyway.
const exitGrace = 100 * time.Millisecond

// options are the command-line flags.
type options struct {
	databaseURL       string
	workerID          string
	handoffAddr       string
	handoffTokenFile  string
	concurrency       int
	batch             int
	visibilityTimeout time.Duration
	pollInterval      time.Duration
	lease             string
	shards            []string
	leaderInterval    time.Duration
	migrate           bool
	withoutHandoff    bool
	faultAddr         string // faults.go
}

// parseFlags parses args (without the program name) and fills in the
// defaults that come from the environment.
func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("pgworker", flag.ContinueOnError)
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL URL, like postgres://user@host:5432/db (default $DATABASE_URL)")
	fs.StringVar(&o.workerID, "worker-id", "", "name of this worker in claims and logs (default $HANDOFF_POD_NAME, else the host name)")
	fs.StringVar(&o.handoffAddr, "handoff-addr", "", "where to serve the handoff app API, for the sidecar: unix:///handoff-run/app.sock, or a loopback address like http://127.0.0.1:7452 (default $"+protocol.AppURLEnv+", which the injector sets)")
	fs.StringVar(&o.handoffTokenFile, "handoff-token-file", "", "file with the pod's token, which the sidecar's calls must carry (default $HANDOFF_TOKEN_FILE, set by the injector)")
	fs.IntVar(&o.concurrency, "concurrency", 4, "number of messages worked on at once")
	fs.IntVar(&o.batch, "batch", 4, "messages each claim loop claims in one statement and works on in turn; those not started are handed back at stop-claiming")
	fs.DurationVar(&o.visibilityTimeout, "visibility-timeout", 30*time.Second, "how long a claim hides a message from other workers")
	fs.DurationVar(&o.pollInterval, "poll-interval", 200*time.Millisecond, "wait before claiming again when the queue is empty")
	fs.StringVar(&o.lease, "lease", "", "name of the Lease whose leader runs the leader job (empty: no leader job)")
	shards := fs.String("shards", "", "the pod's shard set, as handoff.dev/shards: PREFIX{0..K} or comma-separated Lease names; the worker claims only messages of the shards it leads (default $HANDOFF_SHARDS, set by the injector; empty: messages of no shard, --concurrency loops)")
	fs.DurationVar(&o.leaderInterval, "leader-interval", time.Second, "how often the leader runs the leader job")
	fs.BoolVar(&o.migrate, "migrate", true, "create the queue's tables at start if they do not exist")
	fs.BoolVar(&o.withoutHandoff, "without-handoff", false, "baseline: hold --lease in this process with client-go leader election (lease duration 15s, renew deadline 10s, retry period 2s, not released at exit; API from $KUBECONFIG or in-cluster) instead of through the handoff sidecar")
	fs.StringVar(&o.faultAddr, "fault-addr", "", "tests only: host:port, like :7460, to serve GET /healthz (a liveness endpoint), POST /fault/unhealthy (it fails from then on) and POST /fault/crash (exit 3 at once) on; no authentication (empty: off)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if *shards == "" {
		*shards = os.Getenv(protocol.ShardsEnv)
	}
	names, err := config.ParseShards(*shards)
	if err != nil {
		return o, fmt.Errorf("--shards %q: %w; want PREFIX{0..K} like orders-{0..11}, or comma-separated Lease names", *shards, err)
	}
	o.shards = names

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
	switch {
	case o.concurrency < 1:
		return o, fmt.Errorf("--concurrency %d: want 1 or more", o.concurrency)
	case o.batch < 1:
		return o, fmt.Errorf("--batch %d: want 1 or more", o.batch)
	case o.visibilityTimeout <= 0:
		return o, fmt.Errorf("--visibility-timeout %v: want more than 0", o.visibilityTimeout)
	case o.pollInterval <= 0:
		return o, fmt.Errorf("--poll-interval %v: want more than 0", o.pollInterval)
	case o.leaderInterval <= 0:
		return o, fmt.Errorf("--leader-interval %v: want more than 0", o.leaderInterval)
	case o.withoutHandoff && o.lease == "":
		return o, errors.New("--without-handoff: want --lease too, the Lease to hold (without a Lease the flag changes nothing)")
	}
	return o, nil
}

// newLogger returns a logger writing JSON lines to stderr, with the time in
// "ts" as RFC 3339 with nanoseconds. Nothing is sampled away: every line
// counts for the timeline.
func newLogger() logr.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	enc.EncodeDuration = zapcore.StringDurationEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(os.Stderr), zapcore.InfoLevel)
	return zapr.NewLogger(zap.New(core))
}

func main() { os.Exit(main1()) }

// main1 is main, returning the exit code: 0 after a signal, 1 on an error,
// 2 for bad flags.
func main1() int {
	log := newLogger()
	opts, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		log.Error(err, "bad flags")
		return 2
	}
	log = log.WithValues("worker", opts.workerID)
	klog.SetLogger(log.WithName("client-go")) // client-go's leader election logs through klog

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, log, opts); err != nil {
		log.Error(err, "exiting")
		return 1
	}
	log.Info("exiting")
	return 0
}

// app is one running worker.
type app struct {
	opts  options
	log   logr.Logger
	pool  *pgxpool.Pool
	agent *worker.Agent
	// visible wakes the idle claim loops when messages become visible;
	// nil: they poll only.
	visible *queue.Listener
	// beginLeading is the Agent's, or with --without-handoff the in-process
	// elector's.
	beginLeading func(ctx context.Context, lease string) (context.Context, worker.Leadership, func(), error)
}

// run works until ctx ends (a signal) and returns nil then, or returns the
// error that stopped it.
func run(ctx context.Context, log logr.Logger, opts options) error {
	var elector *elector
	if opts.withoutHandoff {
		leases, namespace, err := leasesClient()
		if err == nil {
			elector, err = newElector(leases, namespace, opts.lease, opts.workerID, log.WithName("leaderelection"))
		}
		if err != nil {
			return err
		}
	}
	cfg, err := pgxpool.ParseConfig(opts.databaseURL)
	if err != nil {
		return fmt.Errorf("--database-url: %w", err)
	}
	// A connection per claim loop (per shard with --shards), one for the leader job, one for
	// HandBack and one for ReturnClaims, so handing back never waits for a
	// connection.
	cfg.MaxConns = max(cfg.MaxConns, int32(max(opts.concurrency, len(opts.shards))+3))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	if opts.migrate {
		if err := queue.Migrate(ctx, pool); err != nil {
			pool.Close()
			return err
		}
	}

	if opts.faultAddr != "" {
		stopFaults, err := startFaults(opts.faultAddr, log)
		if err != nil {
			pool.Close()
			return err
		}
		defer stopFaults()
	}

	a, err := newApp(opts, log, pool)
	if err != nil {
		pool.Close()
		return err
	}
	if elector != nil {
		a.beginLeading = elector.beginLeading
	}
	// A message handed back by a leaving pod is claimed again by an idle
	// loop at once, not at its next poll.
	lctx, stopListening := context.WithCancel(ctx)
	defer stopListening()
	a.visible = queue.Listen(lctx, pool.Config().ConnConfig, time.Second, log.WithName("listen"))

	// Listen before the first claim: from then on the sidecar must be able
	// to stop claiming and hand work back. The baseline, with no sidecar,
	// serves only where it is told to.
	served := make(chan error, 1)
	if !opts.withoutHandoff || opts.handoffAddr != "" {
		ln, err := listenApp(ctx, opts.handoffAddr)
		if err != nil {
			pool.Close()
			return err
		}
		srv := &http.Server{Handler: a.agent.Handler(), ReadHeaderTimeout: 5 * time.Second}
		defer func() { _ = srv.Close() }()
		go func() { served <- srv.Serve(ln) }()
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var loops sync.WaitGroup
	a.startLoops(ctx, &loops)
	if opts.lease != "" {
		loops.Go(func() { a.leaderLoop(ctx) })
	}
	if elector != nil {
		loops.Go(func() { elector.run(ctx) })
	}
	log.Info("started", "concurrency", opts.concurrency, "batch", opts.batch, "visibilityTimeout", opts.visibilityTimeout,
		"handoffAddr", opts.handoffAddr, "lease", opts.lease, "shards", len(opts.shards), "withoutHandoff", opts.withoutHandoff)

	select {
	case <-ctx.Done():
		log.Info("signal received: exiting, leaving unfinished claims to the sidecar or their visibility timeout")
	case err = <-served:
		err = fmt.Errorf("serve the handoff app API: %w", err)
	}
	cancel()
	// Do not wait for work: claims left are the sidecar's to hand back (or
	// they come back after the visibility timeout).
	closed := make(chan struct{})
	go func() { loops.Wait(); pool.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(exitGrace):
	}
	return err
}

// startLoops starts the claim loops: --concurrency of them for the messages
// of no shard, or, with --shards, one per shard.
func (a *app) startLoops(ctx context.Context, loops *sync.WaitGroup) {
	if len(a.opts.shards) > 0 {
		for _, shard := range a.opts.shards {
			loops.Go(func() { a.shardLoop(ctx, shard) })
		}
		return
	}
	for range a.opts.concurrency {
		loops.Go(func() { a.claimLoop(ctx) })
	}
}

// newApp returns the worker on pool, with its Agent; its loops are not
// started.
func newApp(opts options, log logr.Logger, pool *pgxpool.Pool) (*app, error) {
	a := &app{opts: opts, log: log, pool: pool}
	agent, err := worker.New(worker.Options{
		ReturnClaims: a.returnClaims,
		HandBack:     a.handBack,
		Logger:       log.WithName("handoff"),
		TokenFile:    opts.handoffTokenFile,
		// The baseline has no sidecar, and so maybe no token.
		InsecureNoToken: opts.withoutHandoff,
	})
	if err != nil {
		return nil, err
	}
	a.agent = agent
	a.beginLeading = a.agent.BeginLeading
	return a, nil
}

// listenApp listens where the sidecar calls the app API: addr, else
// $HANDOFF_APP_URL (the injector sets it to the app socket in the
// handoff-run volume); a socket, or a loopback address (the calls are also
// signed with the pod's token).
func listenApp(ctx context.Context, addr string) (net.Listener, error) {
	if addr == "" {
		if addr = os.Getenv(protocol.AppURLEnv); addr == "" {
			return nil, fmt.Errorf("--handoff-addr: not given and %s is not set; want unix://%s or a loopback address like http://127.0.0.1:7452", protocol.AppURLEnv, protocol.AppSocket)
		}
	}
	e, err := protocol.ParseEndpoint(addr)
	if err != nil {
		return nil, fmt.Errorf("--handoff-addr: %w", err)
	}
	ln, err := e.Listen(ctx)
	if err != nil {
		return nil, fmt.Errorf("--handoff-addr %s: %w", addr, err)
	}
	return ln, nil
}

// claimLoop receives up to --batch messages at a time and works on them in
// turn until claiming stops or ctx ends. A message not started by
// stop-claiming is handed back by the Agent (handBack); Start refuses it
// and the loop goes on to the next.
func (a *app) claimLoop(ctx context.Context) {
	for {
		r, err := a.agent.Receive(ctx)
		if err != nil { // worker.ErrStopping, or ctx ended
			return
		}
		batch := a.receive(ctx, r)
		if batch == nil { // the receive ended: Receive refuses next
			r.End()
			continue
		}
		claims := make([]*worker.Claim, len(batch))
		for i, c := range batch {
			claims[i] = r.HoldUnstarted(c)
			a.log.Info("claimed", "id", c.ID, "dedupKey", c.DedupKey, "deliveries", c.Deliveries, "workMillis", c.WorkMillis)
		}
		r.End()
		for i, claim := range claims {
			if claim.Start() != nil { // worker.ErrHandedBack: handBack has it
				continue
			}
			// A message that waited in the batch past its visibility
			// timeout may be another worker's now: work it only if the
			// claim is still this one's, hidden again from now.
			if i > 0 && !a.renew(ctx, batch[i]) {
				claim.Done()
				continue
			}
			a.process(claim.Context(), batch[i])
			claim.Done()
		}
	}
}

// renew renews the claim of c before it is started (queue.Renew), and
// reports whether it is still this worker's. A failed renewal is not a
// lost claim: the message is worked, as it would have been without it.
func (a *app) renew(ctx context.Context, c *queue.Claimed) bool {
	ok, err := queue.Renew(ctx, a.pool, a.opts.workerID, c, a.opts.visibilityTimeout)
	switch {
	case err != nil:
		a.log.Error(err, "renew failed", "id", c.ID)
		return true
	case !ok:
		a.log.Info("claim lost before its start: claimed again after its visibility timeout, or done", "id", c.ID, "deliveries", c.Deliveries)
	}
	return ok
}

// shardLoop works shard while this worker leads it, until claiming stops
// or ctx ends: at each term (BeginLeading), claimShard; between terms it
// waits for a change of leadership.
func (a *app) shardLoop(ctx context.Context, shard string) {
	for ctx.Err() == nil {
		changed := a.agent.LeadershipChanged()
		lctx, lead, done, err := a.agent.BeginLeading(ctx, shard)
		if err != nil { // worker.ErrNotLeader
			select {
			case <-changed:
			case <-a.agent.Stopping():
				return
			case <-ctx.Done():
			}
			continue
		}
		a.log.Info("leading shard", "shard", shard, "token", lead.FencingToken)
		stopped := a.claimShard(ctx, lctx, shard, lead.FencingToken)
		// The revoke's acknowledgement waits for this: the Lease is freed
		// only once this shard's claims are finished or handed back.
		done()
		a.log.Info("shard work stopped", "shard", shard, "token", lead.FencingToken)
		if stopped {
			return
		}
	}
}

// claimShard claims and works messages of shard, with token, until lctx
// ends (the term's end: revoked, lost, run out) or claiming stops (then it
// returns true). Messages of a batch not started when the term ends are
// handed back at once; started ones are finished (the term's end does not
// cancel them), which the revoke waits for. The receive and the claim
// statement run with ctx, not lctx: a claim's context derives from the
// receive's, and a statement cut off by the term's end might commit a
// claim this worker never learns of.
func (a *app) claimShard(ctx, lctx context.Context, shard string, token int64) (stopped bool) {
	for lctx.Err() == nil {
		r, err := a.agent.Receive(ctx)
		if err != nil { // worker.ErrStopping, or ctx ended
			return errors.Is(err, worker.ErrStopping)
		}
		// The wait between polls ends at stop-claiming or the term's end.
		wctx, cancel := context.WithCancel(r.Context())
		stop := context.AfterFunc(lctx, cancel)
		var batch []*queue.Claimed
		for wctx.Err() == nil && batch == nil {
			visible := a.visible.Visible()
			cs, err := queue.ClaimShard(ctx, a.pool, a.opts.workerID, shard, a.opts.visibilityTimeout, a.opts.batch)
			if err != nil && ctx.Err() == nil {
				a.log.Error(err, "claim failed", "shard", shard)
			}
			if len(cs) > 0 {
				batch = cs
				break
			}
			wait(wctx, a.opts.pollInterval, visible)
		}
		stop()
		cancel()
		claims := make([]*worker.Claim, len(batch))
		for i, c := range batch {
			claims[i] = r.HoldUnstarted(c)
			a.log.Info("claimed", "id", c.ID, "dedupKey", c.DedupKey, "shard", shard, "token", token, "deliveries", c.Deliveries)
		}
		r.End()
		for i, claim := range claims {
			if lctx.Err() != nil { // the term ended: the rest goes back now
				a.handBackUnstarted(claims[i:])
				break
			}
			if claim.Start() != nil { // worker.ErrHandedBack: handBack has it
				continue
			}
			if i > 0 && !a.renew(ctx, batch[i]) { // waited past its visibility timeout: maybe another's now
				claim.Done()
				continue
			}
			a.processFenced(claim.Context(), batch[i], token)
			claim.Done()
		}
	}
	return false
}

// handBackUnstarted hands back the claims of a shard whose term ended,
// those stop-claiming did not take already, and ends them.
func (a *app) handBackUnstarted(claims []*worker.Claim) {
	var mine []*worker.Claim
	for _, c := range claims {
		if c.Start() == nil { // not taken by stop-claiming: ours to hand back
			mine = append(mine, c)
		}
	}
	if len(mine) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = a.handBack(ctx, mine) // logged; else their visibility timeout brings them back
		cancel()
	}
	for _, c := range mine {
		c.Done()
	}
}

// work does c's work (it waits c.WorkMillis) and reports whether it was
// done: false when ctx ended first, or the claim was found lost. While it
// works, it renews the claim every third of the visibility timeout
// (queue.Renew), so that work longer than the timeout is not delivered to
// another worker meanwhile; a claim found lost (claimed again, after a
// renewal came too late) ends the work undone.
func (a *app) work(ctx context.Context, c *queue.Claimed) bool {
	work := time.NewTimer(time.Duration(c.WorkMillis) * time.Millisecond)
	defer work.Stop()
	keep := time.NewTicker(a.opts.visibilityTimeout / 3)
	defer keep.Stop()
	for {
		select {
		case <-work.C:
			return true
		case <-keep.C:
			if !a.renew(ctx, c) {
				return false
			}
		case <-ctx.Done():
			a.log.Info("work canceled", "id", c.ID)
			return false
		}
	}
}

// processFenced is process for a message of a shard, completed fenced by
// the shard's token.
func (a *app) processFenced(ctx context.Context, c *queue.Claimed, token int64) {
	if !a.work(ctx, c) {
		return
	}
	applied, err := queue.CompleteFenced(ctx, a.pool, a.opts.workerID, c, token)
	switch {
	case errors.Is(err, queue.ErrStaleFencingToken):
		a.log.Info("completion refused: stale fencing token", "id", c.ID, "shard", c.Shard, "token", token)
	case err != nil:
		a.log.Error(err, "complete failed", "id", c.ID)
	case applied:
		a.log.Info("applied", "id", c.ID, "dedupKey", c.DedupKey, "shard", c.Shard, "token", token)
	default:
		a.log.Info("duplicate", "id", c.ID, "dedupKey", c.DedupKey)
	}
}

// receive polls the queue every --poll-interval, and at once when messages
// become visible (queue.Listener), until it claims up to --batch messages,
// and returns them, or until r ends (stop-claiming, or ctx), and returns
// nil.
func (a *app) receive(ctx context.Context, r *worker.Receive) []*queue.Claimed {
	for r.Context().Err() == nil {
		// The claim runs with ctx, not r's context: cut off by
		// stop-claiming, the statement might commit a claim this worker
		// never learns of. r is pending while it runs, so messages claimed
		// in the race with stop-claiming are held, then handed back.
		visible := a.visible.Visible()
		cs, err := queue.ClaimBatch(ctx, a.pool, a.opts.workerID, a.opts.visibilityTimeout, a.opts.batch)
		if err != nil && ctx.Err() == nil {
			a.log.Error(err, "claim failed")
		}
		if len(cs) > 0 {
			return cs
		}
		wait(r.Context(), a.opts.pollInterval, visible)
	}
	return nil
}

// process works on c and completes it. If ctx ends first (the sidecar's
// cancel fallback, or a signal) it leaves c claimed: the sidecar returns it
// with ReturnClaims, or its visibility timeout does.
func (a *app) process(ctx context.Context, c *queue.Claimed) {
	if !a.work(ctx, c) {
		return
	}
	applied, err := queue.Complete(ctx, a.pool, a.opts.workerID, c)
	switch {
	case err != nil:
		a.log.Error(err, "complete failed", "id", c.ID)
	case applied:
		a.log.Info("applied", "id", c.ID, "dedupKey", c.DedupKey)
	default:
		a.log.Info("duplicate", "id", c.ID, "dedupKey", c.DedupKey)
	}
}

// wait waits for d, or until ctx ends or visible is closed (messages
// became visible: queue.Listener).
func wait(ctx context.Context, d time.Duration, visible <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-visible:
	}
}

// returnClaims is the Agent's ReturnClaims: it makes every message this
// worker holds visible again.
func (a *app) returnClaims(ctx context.Context) (int, error) {
	n, err := queue.ReturnClaims(ctx, a.pool, a.opts.workerID)
	if err != nil {
		a.log.Error(err, "return claims failed")
		return 0, err
	}
	a.log.Info("returned", "count", n)
	return n, nil
}

// handBack is the Agent's HandBack: at stop-claiming it makes the messages
// claimed and not started visible again at once, unless claimed again
// since.
func (a *app) handBack(ctx context.Context, claims []*worker.Claim) error {
	cs := make([]*queue.Claimed, len(claims))
	ids := make([]int64, len(claims))
	for i, c := range claims {
		cs[i] = c.Value().(*queue.Claimed)
		ids[i] = cs[i].ID
	}
	n, err := queue.HandBack(ctx, a.pool, a.opts.workerID, cs)
	if err != nil {
		a.log.Error(err, "hand back failed", "ids", ids)
		return err
	}
	a.log.Info("handed back", "count", n, "ids", ids)
	return nil
}

// leaderLoop runs the leader job every --leader-interval while this worker
// leads --lease, until ctx ends.
func (a *app) leaderLoop(ctx context.Context) {
	tick := time.NewTicker(a.opts.leaderInterval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
		lctx, lead, done, err := a.beginLeading(ctx, a.opts.lease)
		if err != nil { // worker.ErrNotLeader
			continue
		}
		err = queue.RunLeaderJobUntil(lctx, a.pool, a.opts.lease, lead.FencingToken, a.opts.workerID, lead.Until)
		done()
		switch {
		case errors.Is(err, queue.ErrStaleFencingToken):
			a.log.Info("leader job refused", "lease", a.opts.lease, "token", lead.FencingToken, "error", err.Error())
		case err != nil:
			if ctx.Err() == nil {
				a.log.Error(err, "leader job failed", "lease", a.opts.lease, "token", lead.FencingToken)
			}
		default:
			a.log.Info("leader job", "lease", a.opts.lease, "token", lead.FencingToken)
		}
	}
}
