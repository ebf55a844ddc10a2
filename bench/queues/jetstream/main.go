// Command jetstream measures, on a real nats-server with JetStream, the
// time from a leaving worker's drain deadline to another worker claiming
// the message the leaving worker had not finished, in one run:
//
//   - with the adapter (worker/jetstream): at the deadline the sidecar's
//     fallback calls ReturnClaims, which Naks the message; the successor's
//     pending fetch gets it at once;
//   - without it: a plain nats.go worker that fetched the message just
//     leaves at the deadline (closes its connection), and the message comes
//     back when its AckWait runs out, counted from its delivery.
//
// Each run has its own stream and durable consumer (AckWait -ack-wait, 30 s
// by default, nats-server's default) and one message. The leaving worker's
// deadline comes -drain after its handler started (0 by default: the
// deadline right after the message was delivered, so without the adapter
// the successor waits AckWait less that drain). The successor is already
// fetching when the deadline comes. The runs without the adapter run at
// once, so the whole command takes about one AckWait.
//
// It prints one table row, "queue | with adapter | without (queue's own
// timeout) | ratio", with the median of -runs runs each, and the runs on
// stderr.
//
// Usage: go run ./bench/queues/jetstream [-runs 5] [-ack-wait 30s] [-drain 0s]
// (it starts its own nats-server, built by hack/nats-server.sh if missing).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/handoff-dev/handoff/bench/internal/stats"
	"github.com/handoff-dev/handoff/internal/natstest"
	"github.com/handoff-dev/handoff/worker"
	"github.com/handoff-dev/handoff/worker/jetstream"
)

var (
	runs    = flag.Int("runs", 5, "runs with the adapter, and runs without it (these run at once)")
	ackWait = flag.Duration("ack-wait", 30*time.Second, "the consumers' AckWait (nats-server's default: 30s)")
	drain   = flag.Duration("drain", 0, "time from the leaving worker's handler starting to its drain deadline")
)

// runTimeout bounds one run: the successor must have claimed the message
// by AckWait plus this.
const runTimeout = 30 * time.Second

func main() {
	flag.Parse()
	if *runs < 1 || *ackWait <= 0 || *drain < 0 {
		fmt.Fprintln(os.Stderr, "jetstream: want -runs 1 or more, -ack-wait above 0, -drain 0 or more")
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "jetstream:", err)
		os.Exit(1)
	}
}

func run() error {
	url, stop, err := natstest.StartServer()
	if err != nil {
		return err
	}
	defer stop()
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	version := nc.ConnectedServerVersion()

	// Without the adapter: every run at once, each waiting out AckWait.
	without := make([]time.Duration, *runs)
	errs := make([]error, *runs)
	var wg sync.WaitGroup
	for i := range *runs {
		wg.Go(func() { without[i], errs[i] = measure(url, fmt.Sprintf("without_%d", i), false) })
	}
	// With it: in turn, meanwhile.
	with := make([]time.Duration, *runs)
	for i := range *runs {
		if with[i], err = measure(url, fmt.Sprintf("with_%d", i), true); err != nil {
			return fmt.Errorf("with the adapter, run %d: %w", i+1, err)
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("without the adapter: %w", err)
	}
	fmt.Fprintf(os.Stderr, "with the adapter (Nak at ReturnClaims):      %s\n", list(with))
	fmt.Fprintf(os.Stderr, "without (the message's AckWait runs out):    %s\n", list(without))

	w, wo := stats.Percentile(with, 50), stats.Percentile(without, 50)
	fmt.Println("queue | with adapter | without (queue's own timeout) | ratio")
	fmt.Printf("NATS JetStream (nats-server %s, AckWait %s, drain %s; median of %d) | %s | %s | %.0f×\n",
		version, *ackWait, *drain, *runs, stats.Round(w), stats.Round(wo), float64(wo)/float64(max(w, time.Microsecond)))
	return nil
}

// measure runs one handover on a stream of its own and returns the time
// from the leaving worker's drain deadline to the successor receiving the
// message.
func measure(url, name string, adapter bool) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), *ackWait+*drain+runTimeout)
	defer cancel()
	admin, err := nats.Connect(url)
	if err != nil {
		return 0, err
	}
	defer admin.Close()
	j, err := js.New(admin)
	if err != nil {
		return 0, err
	}
	subject := name + ".work"
	if _, err := j.CreateStream(ctx, js.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
		return 0, err
	}
	defer func() { _ = j.DeleteStream(context.Background(), name) }()
	if _, err := j.CreateConsumer(ctx, name, js.ConsumerConfig{Durable: "c", AckPolicy: js.AckExplicitPolicy, AckWait: *ackWait}); err != nil {
		return 0, err
	}
	if _, err := j.Publish(ctx, subject, []byte("1")); err != nil {
		return 0, err
	}

	leaving, err := connect(ctx, url, name)
	if err != nil {
		return 0, err
	}
	defer leaving.nc.Close()

	// The leaving worker takes the message and works on it past its
	// deadline; deadline() is its deadline's step, and returns when.
	var deadline func() (time.Time, error)
	if adapter {
		w, err := jetstream.New(worker.Options{InsecureNoToken: true}, leaving.nc, leaving.cons, jetstream.Config{})
		if err != nil {
			return 0, err
		}
		started := make(chan struct{})
		runCtx, stopRun := context.WithCancel(ctx)
		defer stopRun()
		go func() {
			_ = w.Run(runCtx, func(ctx context.Context, _ js.Msg) error {
				close(started)
				<-ctx.Done() // unfinished at the deadline
				return ctx.Err()
			})
		}()
		select {
		case <-started:
		case <-ctx.Done():
			return 0, errors.New("the leaving worker got no message")
		}
		deadline = func() (time.Time, error) {
			a := w.Agent()
			a.StopClaiming()
			at := time.Now()
			// The sidecar's "return" fallback at the drain deadline.
			n, err := a.Return(ctx, false, 0)
			if err == nil && n != 1 {
				err = fmt.Errorf("ReturnClaims returned %d, want 1", n)
			}
			return at, err
		}
	} else {
		b, err := leaving.cons.Fetch(1, js.FetchMaxWait(10*time.Second))
		if err != nil {
			return 0, err
		}
		if m := <-b.Messages(); m == nil {
			return 0, errors.New("the leaving worker got no message")
		}
		deadline = func() (time.Time, error) {
			at := time.Now()
			leaving.nc.Close() // it exits, the message unacknowledged
			return at, nil
		}
	}
	time.Sleep(*drain)

	successor, err := connect(ctx, url, name)
	if err != nil {
		return 0, err
	}
	defer successor.nc.Close()
	got := make(chan time.Time, 1)
	fetching := make(chan struct{})
	go func() {
		once := sync.OnceFunc(func() { close(fetching) })
		for ctx.Err() == nil {
			b, err := successor.cons.Fetch(1, js.FetchMaxWait(5*time.Second))
			once() // its first pull request is on the server
			if err != nil {
				continue
			}
			if m := <-b.Messages(); m != nil {
				got <- time.Now()
				_ = m.DoubleAck(ctx)
				return
			}
		}
	}()
	<-fetching
	// Let the pull request reach the server before the deadline.
	if err := successor.nc.FlushWithContext(ctx); err != nil {
		return 0, err
	}

	at, err := deadline()
	if err != nil {
		return 0, err
	}
	select {
	case t := <-got:
		d := t.Sub(at)
		fmt.Fprintf(os.Stderr, "%s: %s\n", name, stats.Round(d))
		return d, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("%s: the successor did not get the message within AckWait %s + %s", name, *ackWait, runTimeout)
	}
}

// conn is one worker's connection and its view of consumer "c".
type conn struct {
	nc   *nats.Conn
	cons js.Consumer
}

// connect connects to url and returns consumer "c" of stream on it.
func connect(ctx context.Context, url, stream string) (conn, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return conn{}, err
	}
	j, err := js.New(nc)
	if err != nil {
		nc.Close()
		return conn{}, err
	}
	c, err := j.Consumer(ctx, stream, "c")
	if err != nil {
		nc.Close()
		return conn{}, err
	}
	return conn{nc: nc, cons: c}, nil
}

// list prints durations rounded, in order.
func list(d []time.Duration) string {
	s := slices.Clone(d)
	slices.Sort(s)
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += stats.Round(x).String()
	}
	return out
}
