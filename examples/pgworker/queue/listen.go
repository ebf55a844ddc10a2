package queue

import (
	"context"
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
// connects again retry later; the claim loops keep polling meanwhile.
func Listen(ctx context.Context, cfg *pgx.ConnConfig, retry time.Duration, log logr.Logger) *Listener {
	l := &Listener{ch: make(chan struct{})}
	go func() {
		for ctx.Err() == nil {
			err := l.listen(ctx, cfg.Copy())
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

func (l *Listener) listen(ctx context.Context, cfg *pgx.ConnConfig) error {
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
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		l.wake()
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
