// Command rabbitmq measures, on a real RabbitMQ node, how long an
// unfinished delivery takes to be delivered again to another worker after a
// leaving worker's drain deadline, with the handoff adapter
// (worker/rabbitmq) and without it, in one run, and prints one row:
//
//	queue | with adapter | without (queue's own timeout) | ratio
//
// Both cases run at once, each on its own queue of the same node, with a
// survivor consuming it:
//
//   - with: the leaving worker is an Adapter working one delivery. At the
//     deadline its Agent returns the claims (the sidecar's "return"
//     fallback, Agent.Return: basic.nack requeue=true).
//   - without: the leaving worker is a plain consumer holding the delivery
//     unacknowledged. RabbitMQ keeps it on that consumer until its channel
//     or connection closes: here when the process is killed at the pod's
//     deletion deadline, -kill-after after the drain deadline (the
//     sidecar's defaults: deadline-margin 2s + handback-reserve 2s), which
//     the command plays by closing the worker's TCP connection without an
//     AMQP close, as the kernel does for a killed process. A worker whose
//     node is lost instead is noticed only by the heartbeat timeout (tens of
//     seconds), and a hung one by consumer_timeout (30 min).
//
// The time runs from the deadline to the survivor's handler getting the
// delivery.
//
// Usage: go run ./bench/queues/rabbitmq [-kill-after 4s] [-url amqp://…].
// Without -url it starts its own node with hack/rabbitmq.sh (installing
// Debian's rabbitmq-server if missing), run from the module root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/handoff-dev/handoff/internal/rabbittest"
	"github.com/handoff-dev/handoff/worker"
	"github.com/handoff-dev/handoff/worker/rabbitmq"
)

var (
	killAfter = flag.Duration("kill-after", 4*time.Second, "without the adapter: from the drain deadline to the leaving worker's connection closing (its process killed)")
	url       = flag.String("url", "", "AMQP URL of a RabbitMQ node to use (empty: start one with hack/rabbitmq.sh)")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rabbitmq:", err)
		os.Exit(1)
	}
}

func run() error {
	if *url == "" {
		u, stop, err := rabbittest.StartServer()
		if err != nil {
			return err
		}
		defer stop()
		*url = u
	}
	conn, err := amqp.Dial(*url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), *killAfter+time.Minute)
	defer cancel()

	type result struct {
		d   time.Duration
		err error
	}
	with, without := make(chan result, 1), make(chan result, 1)
	suffix := fmt.Sprint(time.Now().UnixNano())
	go func() { d, err := withAdapter(ctx, conn, "bench.with."+suffix); with <- result{d, err} }()
	go func() { d, err := withoutAdapter(ctx, conn, "bench.without."+suffix); without <- result{d, err} }()
	w, wo := <-with, <-without
	if w.err != nil {
		return fmt.Errorf("with the adapter: %w", w.err)
	}
	if wo.err != nil {
		return fmt.Errorf("without the adapter: %w", wo.err)
	}
	fmt.Printf("Unfinished delivery delivered again after the leaving worker's drain deadline (RabbitMQ %v; without the adapter the leaving worker's connection closes %s after the deadline, when it is killed)\n",
		conn.Properties["version"], *killAfter)
	fmt.Println("queue | with adapter | without (queue's own timeout) | ratio")
	fmt.Printf("RabbitMQ | %s | %s (kept until the connection closes, at the kill) | %.0fx\n",
		w.d.Round(100*time.Microsecond), wo.d.Round(time.Millisecond), float64(wo.d)/float64(w.d))
	return nil
}

// declare declares queue, auto-deleted once its last consumer goes.
func declare(conn *amqp.Connection, queue string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		return err
	}
	return ch.Publish("", queue, false, false, amqp.Publishing{Body: []byte("m")})
}

// survivor consumes queue on conn and sends the time of each delivery to
// got, acknowledging it.
func survivor(ctx context.Context, conn *amqp.Connection, queue string, got chan<- time.Time) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	ds, err := ch.ConsumeWithContext(ctx, queue, "survivor", false, false, false, false, nil)
	if err != nil {
		return err
	}
	go func() {
		defer func() { _ = ch.Close() }()
		for d := range ds {
			got <- time.Now()
			_ = d.Ack(false)
		}
	}()
	return nil
}

func withAdapter(ctx context.Context, conn *amqp.Connection, queue string) (time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := declare(conn, queue); err != nil {
		return 0, err
	}
	leaving, err := rabbitmq.New(worker.Options{InsecureNoToken: true}, conn, rabbitmq.Config{Queue: queue})
	if err != nil {
		return 0, err
	}
	started, got := make(chan struct{}, 1), make(chan time.Time, 1)
	go func() {
		_ = leaving.Run(ctx, func(ctx context.Context, _ amqp.Delivery) error {
			started <- struct{}{}
			<-ctx.Done() // unfinished at the deadline
			return ctx.Err()
		})
	}()
	select {
	case <-started:
	case <-ctx.Done():
		return 0, fmt.Errorf("the leaving worker got no delivery: %w", ctx.Err())
	}
	if err := survivor(ctx, conn, queue, got); err != nil {
		return 0, err
	}
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
		return 0, fmt.Errorf("the survivor got no delivery: %w", ctx.Err())
	}
}

func withoutAdapter(ctx context.Context, conn *amqp.Connection, queue string) (time.Duration, error) {
	if err := declare(conn, queue); err != nil {
		return 0, err
	}
	// The leaving worker has a connection of its own, whose socket the
	// kill closes.
	var sock net.Conn
	lconn, err := amqp.DialConfig(*url, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, 30*time.Second)
		sock = c
		return c, err
	}})
	if err != nil {
		return 0, err
	}
	defer func() { _ = lconn.Close() }()
	ch, err := lconn.Channel()
	if err != nil {
		return 0, err
	}
	ds, err := ch.ConsumeWithContext(ctx, queue, "leaving", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	select {
	case <-ds:
	case <-ctx.Done():
		return 0, errors.New("the leaving worker got no delivery")
	}
	got := make(chan time.Time, 1)
	if err := survivor(ctx, conn, queue, got); err != nil {
		return 0, err
	}
	deadline := time.Now()
	kill := time.AfterFunc(*killAfter, func() { _ = sock.Close() })
	defer kill.Stop()
	select {
	case t := <-got:
		return t.Sub(deadline), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("the survivor got no delivery: %w", ctx.Err())
	}
}
