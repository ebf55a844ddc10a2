package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/handoff-dev/handoff/internal/natstest"
)

func TestMain(m *testing.M) { natstest.Run(m) }

// TestServerHasJetStream: the server started answers JetStream, keeps a
// published message in a stream, and hands it to a consumer.
func TestServerHasJetStream(t *testing.T) {
	nc := natstest.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := natstest.StreamName(t)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := js.Publish(ctx, name+".a", []byte("hello")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("next: %v", err)
	}
	if string(m.Data()) != "hello" {
		t.Fatalf("got %q, want %q", m.Data(), "hello")
	}
	if a, b := natstest.Get(t), natstest.Get(t); a != b {
		t.Fatalf("Get twice in one test binary: %s, then %s; want one server", a, b)
	}
}

// TestStreamNameUnique: two calls give two names.
func TestStreamNameUnique(t *testing.T) {
	if a, b := natstest.StreamName(t), natstest.StreamName(t); a == b {
		t.Fatalf("StreamName twice: %q both times", a)
	}
}
