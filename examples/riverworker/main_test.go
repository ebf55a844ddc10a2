package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	riverqueue "github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/handoff-dev/handoff/internal/pgtest"
	"github.com/handoff-dev/handoff/worker"
)

func TestMain(m *testing.M) { pgtest.Run(m) }

func TestParseFlags(t *testing.T) {
	if _, err := parseFlags([]string{"--database-url", "postgres://x", "--concurrency", "0"}); err == nil || !strings.Contains(err.Error(), "--concurrency") {
		t.Errorf("--concurrency 0: error %v, want one naming --concurrency", err)
	}
	t.Setenv("DATABASE_URL", "")
	if _, err := parseFlags(nil); err == nil || !strings.Contains(err.Error(), "--database-url") {
		t.Errorf("no database URL: error %v, want one naming --database-url", err)
	}
}

// TestRunAppliesJobs runs the worker on a real PostgreSQL: a job inserted
// is applied once, and the worker stops when its context ends.
func TestRunAppliesJobs(t *testing.T) {
	url := pgtest.Database(t)
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, logr.Discard(), options{databaseURL: url, workerID: "w1", handoffAddr: addr, concurrency: 2, migrate: true}, worker.Options{InsecureNoToken: true})
	}()

	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	deadline := time.Now().Add(30 * time.Second)
	var inserted bool
	for !inserted {
		// The worker migrates at start: insert once River's tables exist.
		c, err := riverqueue.NewClient[pgx.Tx](riverpgxv5.New(pool), &riverqueue.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Insert(context.Background(), ApplyArgs{Key: "k1", Millis: 10}, nil); err == nil {
			inserted = true
		} else if time.Now().After(deadline) {
			t.Fatalf("insert: %v", err)
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	for {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM riverworker_applied WHERE key = 'k1' AND worker = 'w1'`).Scan(&n)
		if err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("k1 applied %d times (%v) after 30s, want once", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30s of its context's end")
	}
}

// TestMigrateConcurrently runs the start-up migration of several replicas
// at once on a fresh database, then once more: each succeeds (River's
// migrations applied once, riverworker_applied created once).
func TestMigrateConcurrently(t *testing.T) {
	url := pgtest.Database(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	errs := make(chan error, 4)
	for range cap(errs) {
		// A pool each, as each replica has.
		replica, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer replica.Close()
		go func() { errs <- migrate(context.Background(), replica) }()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Errorf("concurrent migrate: %v", err)
		}
	}
	if err := migrate(context.Background(), pool); err != nil {
		t.Errorf("migrate again: %v", err)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job`).Scan(&n); err != nil {
		t.Errorf("River's tables after migrate: %v", err)
	}
}
