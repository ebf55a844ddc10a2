package conformance

import (
	"context"
	"errors"
	"sync"

	"github.com/handoff-dev/handoff/worker"
)

// AgentLeader is the LeaderFixture of an app built on package worker: leader
// work is BeginLeading on the Agent, whatever the queue, so an adapter's
// test needs only its own Fixture. agent returns the Agent serving
// Target.URL now (a Fixture's Restart replaces it).
func AgentLeader(agent func() *worker.Agent) LeaderFixture {
	return &agentLeader{agent: agent, work: map[string][]leaderWork{}}
}

type leaderWork struct {
	ctx  context.Context
	done func()
}

type agentLeader struct {
	agent func() *worker.Agent
	mu    sync.Mutex
	work  map[string][]leaderWork // by Lease, begun and not released
}

// Lead calls BeginLeading; ErrNotLeader is false.
func (l *agentLeader) Lead(_ context.Context, lease string) (bool, error) {
	ctx, _, done, err := l.agent().BeginLeading(context.Background(), lease)
	if errors.Is(err, worker.ErrNotLeader) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.work[lease] = append(l.work[lease], leaderWork{ctx: ctx, done: done})
	return true, nil
}

// Stopping reports whether the context of every leader work begun for
// lease is done (false when none runs).
func (l *agentLeader) Stopping(_ context.Context, lease string) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ws := l.work[lease]
	for _, w := range ws {
		if w.ctx.Err() == nil {
			return false, nil
		}
	}
	return len(ws) > 0, nil
}

// Release calls done for every leader work begun for lease.
func (l *agentLeader) Release(_ context.Context, lease string) error {
	l.mu.Lock()
	ws := l.work[lease]
	delete(l.work, lease)
	l.mu.Unlock()
	for _, w := range ws {
		w.done()
	}
	return nil
}
