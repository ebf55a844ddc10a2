package sidecar

import "time"

// SetPick sets how c's later sequences pick a successor: the watch-list's
// resourceVersion ("" consistent, "0" the watch cache as it is) and how
// long after the trigger a release waits for it; for the figures of the
// old way beside the new (TestPickFigures).
func (c *Coordinator) SetPick(resourceVersion string, wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pick = pickSettings{resourceVersion: resourceVersion, wait: wait}
}

// PickWait is pickWait, and MakeInjectedPods, StartLoad and Quantiles the
// benchmarks' helpers, for TestPickFigures.
var (
	PickWait         = pickWait
	MakeInjectedPods = makeInjectedPods
	StartLoad        = startLoad
	Quantiles        = quantiles
)
