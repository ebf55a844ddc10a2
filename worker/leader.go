package worker

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/handoff-dev/handoff/protocol"
)

// Leadership is one term as leader of a Lease, as the sidecar told it.
type Leadership struct {
	Lease string
	// FencingToken grows with each new holder of the Lease; pass it to the
	// systems leader work writes to, so they refuse an older holder.
	FencingToken int64
	// Until is when this term ends on this process's clock (Options.Clock)
	// unless renewed.
	Until time.Time
}

// term is the Agent's record of leadership of one Lease. Every field but
// ctx is guarded by Agent.mu; cancel is called only with Agent.mu held
// (except by the timer at Until), so a term checked live under the lock
// stays live until the lock is released.
type term struct {
	lead    Leadership
	ctx     context.Context // ends when the term ends
	cancel  context.CancelFunc
	timer   clock.Timer
	work    int           // leader work begun with BeginLeading and not done
	changed chan struct{} // closed and replaced whenever work goes down
	// older are the terms of the Lease this one replaced (a grant with a
	// new fencing token) whose leader work was not done then: a revoke
	// waits for theirs too.
	older []*term
}

// liveLocked reports whether t is a term that is not over; a.mu must be
// held.
func (a *Agent) liveLocked(t *term) bool {
	return t != nil && t.ctx.Err() == nil && a.clock.Now().Before(t.lead.Until)
}

// Leader returns the current term for lease, and false when this worker
// does not lead it or the term has run out on the Agent's clock.
func (a *Agent) Leader(lease string) (Leadership, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.leases[lease]
	if !a.liveLocked(t) {
		return Leadership{}, false
	}
	return t.lead, true
}

// BeginLeading starts leader work for lease. The returned context ends with
// ctx, or when the term ends (revoked, lost, or run out on the Agent's
// clock); call done when the work is over: the sidecar frees the Lease only
// after every such done. It returns ErrNotLeader when this worker does not
// lead. Once a revoke has been acknowledged, BeginLeading refuses until the
// next grant.
func (a *Agent) BeginLeading(ctx context.Context, lease string) (context.Context, Leadership, func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.leases[lease]
	if !a.liveLocked(t) {
		return nil, Leadership{}, nil, ErrNotLeader
	}
	t.work++
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(t.ctx, cancel)
	var once sync.Once
	done := func() {
		once.Do(func() {
			stop()
			cancel()
			a.mu.Lock()
			t.work--
			close(t.changed)
			t.changed = make(chan struct{})
			a.mu.Unlock()
		})
	}
	return wctx, t.lead, done, nil
}

// Leading returns the terms this worker leads now among the Leases names,
// in the order of names; with no names, every Lease it leads, sorted by
// name. For a shard set (the sidecar's setting shards) pass the shard
// names: the app claims only work of the shards returned, each piece of
// work under BeginLeading of its shard (so that a revoke of the shard, when
// the sidecar sheds it or the pod leaves, waits for that work), and writes
// its effects fenced by that shard's FencingToken. A term ends on revoke,
// on a new fencing token, or at its Until; LeadershipChanged tells when.
func (a *Agent) Leading(names ...string) []Leadership {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(names) == 0 {
		for name := range a.leases {
			names = append(names, name)
		}
		slices.Sort(names)
	}
	var out []Leadership
	for _, name := range names {
		if t := a.leases[name]; a.liveLocked(t) {
			out = append(out, t.lead)
		}
	}
	return out
}

// ShardsFromEnv is the pod's shard set, the Lease names the injector put in
// the worker container's environment variable HANDOFF_SHARDS
// (protocol.ShardsEnv, comma-separated); none when it is unset or empty.
// Pass them to Leading and BeginLeading.
func ShardsFromEnv() []string {
	var out []string
	for _, n := range strings.Split(os.Getenv(protocol.ShardsEnv), ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// LeadershipChanged returns a channel that is closed at the next change of
// the Leases this worker leads: a term begun (a grant with a new fencing
// token) or ended (revoked, replaced, or run out at its Until on the
// Agent's clock). Renewals of a term do not count. Read Leading after it
// is closed, and call LeadershipChanged again for the next change.
func (a *Agent) LeadershipChanged() <-chan struct{} {
	a.lmu.Lock()
	defer a.lmu.Unlock()
	return a.lchanged
}

// leadershipChanged closes the channel of LeadershipChanged and replaces
// it. It takes only a.lmu: the timer of a term's Until calls it.
func (a *Agent) leadershipChanged() {
	a.lmu.Lock()
	close(a.lchanged)
	a.lchanged = make(chan struct{})
	a.lmu.Unlock()
}

// applyLeadership applies one message about lease, if it is the latest:
// under one hold of a.mu it checks and records seq, then starts or extends
// the term (grant not nil) or ends it (grant nil). Checked apart from the
// change, two messages handled at once could interleave: a grant checked
// before a later revoke, applied after the revoke was acknowledged, left
// the worker leading after its ack (the sidecar then frees the Lease). So
// of two messages the one with the lower sequence is stale whatever order
// they are handled in. stale reports a message not applied; ended is the
// term a revoke ended (nil if there was none), whose leader work the
// caller waits for (waitLeaderWork).
func (a *Agent) applyLeadership(lease string, seq int64, grant *Leadership) (stale bool, ended *term) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if last, ok := a.sequences[lease]; ok && seq <= last {
		return true, nil
	}
	a.sequences[lease] = seq
	if grant != nil {
		a.grantLocked(*grant)
		return false, nil
	}
	return false, a.endTermLocked(lease)
}

// grant starts or extends a term. A new fencing token ends the old term.
func (a *Agent) grant(l Leadership) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.grantLocked(l)
}

// grantLocked is grant, a.mu held.
func (a *Agent) grantLocked(l Leadership) {
	t := a.leases[l.Lease]
	var older []*term
	if t != nil && (t.lead.FencingToken != l.FencingToken || t.ctx.Err() != nil) {
		t.cancel()
		t.timer.Stop()
		// Its work, and that of the terms it replaced, may still run.
		for _, o := range append(t.older, t) {
			if o.work > 0 {
				older = append(older, o)
			}
		}
		t = nil
	}
	if t == nil {
		defer a.leadershipChanged() // takes a.lmu alone
	}
	left := l.Until.Sub(a.clock.Now())
	if t == nil {
		ctx, cancel := context.WithCancel(context.Background())
		t = &term{ctx: ctx, cancel: cancel, changed: make(chan struct{}), older: older}
		// Must not take a.mu: a fake clock runs it in Step.
		t.timer = a.clock.AfterFunc(left, func() { cancel(); a.leadershipChanged() })
		a.leases[l.Lease] = t
		a.log.Info("leading", "lease", l.Lease, "fencingToken", l.FencingToken, "until", l.Until)
	} else {
		t.timer.Reset(left)
	}
	t.lead = l
}

// revoke ends the term for lease and waits, until ctx ends, for its leader
// work to be done. It returns ctx's error if the work did not stop in time.
// The term ends under the lock BeginLeading checks it under, so no leader
// work begins once revoke has been called.
func (a *Agent) revoke(ctx context.Context, lease string) error {
	a.mu.Lock()
	t := a.endTermLocked(lease)
	a.mu.Unlock()
	return a.waitLeaderWork(ctx, lease, t)
}

// endTermLocked ends the term for lease, a.mu held, and returns it (nil if
// there is none): its context is canceled, so BeginLeading, which checks
// it under a.mu, begins no leader work from now on.
func (a *Agent) endTermLocked(lease string) *term {
	t := a.leases[lease]
	if t == nil {
		return nil
	}
	t.cancel()
	if t.timer.Stop() {
		a.leadershipChanged() // else the timer's end told it; takes a.lmu alone
	}
	return t
}

// waitLeaderWork waits, until ctx ends, for the leader work of the ended
// term t (nil: none) and of the terms it replaced to be done; it returns
// ctx's error if it was not.
func (a *Agent) waitLeaderWork(ctx context.Context, lease string, t *term) error {
	if t == nil {
		return nil
	}
	a.mu.Lock()
	for _, w := range append(slices.Clone(t.older), t) {
		for w.work > 0 {
			changed := w.changed
			a.mu.Unlock()
			select {
			case <-changed:
			case <-ctx.Done():
				return ctx.Err()
			}
			a.mu.Lock()
		}
	}
	t.older = nil // all done
	a.mu.Unlock()
	a.log.Info("leadership revoked", "lease", lease)
	return nil
}
