package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
)

// VisibleChannel is the PostgreSQL notification channel on which the
// queue's triggers (Migrate) NOTIFY, at the commit of a statement that made
// messages visible at once: Enqueue, HandBack, ReturnClaims, or any other
// writer of handoff_queue. A claim does not notify. A message whose
// visibility timeout runs out sends nothing: pollers still see it.
const VisibleChannel = "handoff_queue_visible"

// ListenerApplicationName is the application_name of the Listener's
// connection, by which pg_stat_activity shows it (its query column shows
// the last statement, a ping most of the time, not the LISTEN).
const ListenerApplicationName = "handoff-queue-listener"

// Listener wakes a worker's idle claim loops when messages become visible,
// so that a message handed back is claimed again at once rather than at the
// next poll. It listens on VisibleChannel over a connection of its own
// (LISTEN holds its connection, so it takes none from the pool).
type Listener struct {
	mu sync.Mutex
	ch chan struct{}
}

// Listen connects with cfg (copied; for a pool, pool.Config().ConnConfig)
// and listens on VisibleChannel until ctx ends. After a failure it logs,
// wakes every waiter (a notification may have been missed meanwhile) and
// connects again retry later; the claim loops keep polling meanwhile. A
// connection without a notification for retry is checked with a ping
// bounded by retry, so one gone silent fails within twice retry. retry
// must be positive: Listen panics otherwise, as time.NewTicker does.
func Listen(ctx context.Context, cfg *pgx.ConnConfig, retry time.Duration, log logr.Logger) *Listener {
	if retry <= 0 {
		// As time.NewTicker: a wait of 0 would spin, connecting or pinging.
		panic(fmt.Sprintf("queue: Listen: retry must be positive, got %s", retry))
	}
	l := &Listener{ch: make(chan struct{})}
	go func() {
		for ctx.Err() == nil {
			err := l.listen(ctx, cfg.Copy(), retry)
			if ctx.Err() != nil {
				return
			}
			log.Error(err, "listening for visible messages failed: polling only until it reconnects", "retry", retry)
			l.wake()
			t := time.NewTimer(retry)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}()
	return l
}

func (l *Listener) listen(ctx context.Context, cfg *pgx.ConnConfig, retry time.Duration) error {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = ListenerApplicationName
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "LISTEN "+VisibleChannel); err != nil {
		return err
	}
	// Messages may have become visible before the LISTEN took effect.
	l.wake()
	for {
		// A connection gone silent (a network partition: no answer, no
		// reset) would otherwise go unnoticed until TCP keepalive gives up,
		// minutes later: after retry without a notification, a ping bounded
		// by retry checks it. A wait that times out leaves the connection
		// usable (pgconn closes it on other errors only).
		wctx, cancel := context.WithTimeout(ctx, retry)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		if err == nil {
			l.wake()
			continue
		}
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, retry)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			return fmt.Errorf("connection check after %s without a notification: %w", retry, err)
		}
	}
}

// Visible returns a channel closed at the next notification (or failure of
// the listener). Take it before the claim that found nothing, so that a
// notification sent in between is not missed. On a nil Listener it is nil
// (never closed).
func (l *Listener) Visible() <-chan struct{} {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ch
}

func (l *Listener) wake() {
	l.mu.Lock()
	defer l.mu.Unlock()
	close(l.ch)
	l.ch = make(chan struct{})
}
