// Command redisstreams measures, on a real Redis server, how long an
// unfinished claim takes to be claimed again by another worker after a
// leaving worker's drain deadline, with the handoff adapter
// (worker/redisstreams) and without it, in one run, and prints one row:
//
//	queue | with adapter | without (queue's own timeout) | ratio
//
// Both cases run at once, each on its own stream of the same server, with
// a survivor that autoclaims with min-idle -visibility-timeout and reads
// new entries blocking up to -block:
//
//   - with: the leaving worker is an Adapter working one entry. At the
//     deadline its Agent returns the claims (the sidecar's "return"
//     fallback, Agent.Return, so XCLAIM to handoff-returned and an entry on
//     the wake stream), and the survivor is an Adapter too.
//   - without: the leaving worker is a plain consumer that read the entry
//     (XREADGROUP) and leaves at the deadline without acknowledging it, as a
//     worker stopped at the end of its grace period does. The survivor is a
//     plain loop: XAUTOCLAIM min-idle -visibility-timeout, then XREADGROUP
//     BLOCK -block. The entry was read just before the deadline, so it waits
//     the whole visibility timeout: an entry read earlier waits less, and
//     one worked longer than the visibility timeout was taken while still
//     worked.
//
// The time runs from the deadline to the survivor's handler getting the
// entry. With the adapter the survivor is blocked in XREADGROUP at the
// deadline, halfway through its -block; the hand-back's entry on the wake
// stream ends that read, and its XAUTOCLAIM takes the returned entry.
//
// Usage: go run ./bench/queues/redisstreams [-visibility-timeout 30s]
// [-block 1s] [-addr host:port]. Without -addr it starts its own server
// with hack/redis.sh (installing Debian's redis-server if missing), run
// from the module root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoff-dev/handoff/internal/redistest"
	"github.com/handoff-dev/handoff/worker"
	"github.com/handoff-dev/handoff/worker/redisstreams"
)

var (
	visibilityTimeout = flag.Duration("visibility-timeout", 30*time.Second, "the survivors' XAUTOCLAIM min-idle (the adapter's VisibilityTimeout), both cases")
	block             = flag.Duration("block", time.Second, "the survivors' XREADGROUP BLOCK, both cases")
	addr              = flag.String("addr", "", "host:port of a Redis server to use (empty: start one with hack/redis.sh)")
)

const group = "bench"

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "redisstreams:", err)
		os.Exit(1)
	}
}

func run() error {
	if *addr == "" {
		a, stop, err := redistest.StartServer()
		if err != nil {
			return err
		}
		defer stop()
		*addr = a
	}
	rdb := redis.NewClient(&redis.Options{Addr: *addr})
	defer func() { _ = rdb.Close() }()
	// Bounds the whole run: the case without the adapter takes about the
	// visibility timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 2**visibilityTimeout+time.Minute)
	defer cancel()

	type result struct {
		d   time.Duration
		err error
	}
	with, without := make(chan result, 1), make(chan result, 1)
	suffix := fmt.Sprint(time.Now().UnixNano())
	go func() { d, err := withAdapter(ctx, rdb, "bench:with:"+suffix); with <- result{d, err} }()
	go func() { d, err := withoutAdapter(ctx, rdb, "bench:without:"+suffix); without <- result{d, err} }()
	w, wo := <-with, <-without
	if w.err != nil {
		return fmt.Errorf("with the adapter: %w", w.err)
	}
	if wo.err != nil {
		return fmt.Errorf("without the adapter: %w", wo.err)
	}
	fmt.Printf("Unfinished claim claimed again after the leaving worker's drain deadline (Redis %s; survivors: XAUTOCLAIM min-idle %s, XREADGROUP BLOCK %s)\n",
		serverVersion(ctx, rdb), *visibilityTimeout, *block)
	fmt.Println("queue | with adapter | without (queue's own timeout) | ratio")
	fmt.Printf("Redis Streams | %s | %s (XAUTOCLAIM min-idle %s) | %.0fx\n",
		w.d.Round(100*time.Microsecond), wo.d.Round(time.Millisecond), *visibilityTimeout, float64(wo.d)/float64(w.d))
	return nil
}

// withAdapter runs the case with the adapter on stream and returns the time
// from the deadline to the survivor's handler.
func withAdapter(ctx context.Context, rdb *redis.Client, stream string) (time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		return 0, err
	}
	cfg := redisstreams.Config{Stream: stream, Group: group, VisibilityTimeout: *visibilityTimeout, Block: *block}
	cfg.Consumer = "leaving"
	leaving, err := redisstreams.New(worker.Options{InsecureNoToken: true}, rdb, cfg)
	if err != nil {
		return 0, err
	}
	cfg.Consumer = "survivor"
	survivor, err := redisstreams.New(worker.Options{InsecureNoToken: true}, rdb, cfg)
	if err != nil {
		return 0, err
	}
	started, got := make(chan struct{}, 1), make(chan time.Time, 1)
	go func() {
		_ = leaving.Run(ctx, func(ctx context.Context, _ redis.XMessage) error {
			started <- struct{}{}
			<-ctx.Done() // unfinished at the deadline
			return ctx.Err()
		})
	}()
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"n", 1}}).Err(); err != nil {
		return 0, err
	}
	select {
	case <-started:
	case <-ctx.Done():
		return 0, fmt.Errorf("the leaving worker got no entry: %w", ctx.Err())
	}
	// The survivor starts once the leaving worker has the entry, and is
	// past its first look: it waits in XREADGROUP.
	go func() {
		_ = survivor.Run(ctx, func(context.Context, redis.XMessage) error {
			got <- time.Now()
			return nil
		})
	}()
	time.Sleep(*block / 2)
	agent := leaving.Agent()
	agent.StopClaiming()
	deadline := time.Now()
	if n, err := agent.Return(ctx, false, 0); err != nil || n != 1 {
		return 0, fmt.Errorf("return at the deadline: %d returned, %w; want 1", n, err)
	}
	select {
	case t := <-got:
		return t.Sub(deadline), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("the survivor got no entry: %w", ctx.Err())
	}
}

// withoutAdapter runs the case without the adapter on stream and returns
// the time from the deadline to the survivor getting the entry.
func withoutAdapter(ctx context.Context, rdb *redis.Client, stream string) (time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		return 0, err
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"n", 1}}).Err(); err != nil {
		return 0, err
	}
	// The leaving worker reads it and leaves at its deadline, unfinished.
	read, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "leaving", Streams: []string{stream, ">"}, Count: 1, Block: -1}).Result()
	if err != nil || len(read) != 1 || len(read[0].Messages) != 1 {
		return 0, fmt.Errorf("the leaving worker's read: %v, %w; want one entry", read, err)
	}
	deadline := time.Now()
	// The survivor: a plain consumer loop.
	for {
		msgs, _, err := rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: stream, Group: group, Consumer: "survivor", MinIdle: *visibilityTimeout, Start: "0-0", Count: 10,
		}).Result()
		if err != nil {
			return 0, err
		}
		if len(msgs) > 0 {
			return time.Since(deadline), rdb.XAck(ctx, stream, group, msgs[0].ID).Err()
		}
		err = rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "survivor", Streams: []string{stream, ">"}, Count: 10, Block: *block}).Err()
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, err
		}
	}
}

// serverVersion is the server's redis_version, or "?".
func serverVersion(ctx context.Context, rdb *redis.Client) string {
	info, err := rdb.InfoMap(ctx, "server").Result()
	if err != nil {
		return "?"
	}
	if v := info["Server"]["redis_version"]; v != "" {
		return v
	}
	return "?"
}
