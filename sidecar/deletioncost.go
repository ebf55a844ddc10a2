package sidecar

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/handoff-dev/handoff/protocol"
)

// Bounds of the pod-deletion-cost the sidecar keeps (setting deletion-cost).
const (
	// costPoll is how often the sidecar reads the app's work (a drain call
	// with waitMillis 0, bounded by costReadTimeout) and its Leases while
	// the pod runs.
	costPoll        = 2 * time.Second
	costReadTimeout = time.Second
	// costSettle: a lower cost is written only once it has been the cost
	// for this long, so a worker between two jobs, or a Lease lost and won
	// back, does not write twice.
	costSettle = 20 * time.Second
	// costBurst and costEvery bound the writes: at most costBurst at once,
	// then one per costEvery (a token bucket), so at most 6 a minute
	// sustained, however the work changes.
	costBurst = 3
	costEvery = 10 * time.Second
	// costWriteTimeout bounds each write; a failed one is tried again at a
	// later poll, within the token bucket (a failed write spends a token).
	costWriteTimeout = 2 * time.Second
)

// Parts of DeletionCost; the cost is their sum.
const (
	costUnstarted = 1      // claims held, none started: handed back at once at stop-claiming
	costWorking   = 10     // work in progress, plus costWorking per age step (costAges)
	costPartition = 100    // each partition Lease held (a shard or a Lease of setting leases)
	costRole      = 10_000 // each role Lease held
	costMaxLeases = 99     // Leases counted per kind, at most
)

// costAges are the ages of the oldest work in progress at which its cost
// steps up by costWorking: under 10 s, 1 min, 10 min, 1 h, and beyond.
var costAges = []time.Duration{10 * time.Second, time.Minute, 10 * time.Minute, time.Hour}

// DeletionCost is the pod-deletion-cost (corev1.PodDeletionCost) of a pod
// that holds role role Leases and partition partition Leases (shards
// included) and whose app reported st, its drain status while running:
// 0 for an idle pod (nothing held; a ReplicaSet scaling in deletes the pods
// of lowest cost first), 1 with claims held and none started, 10 to 50
// with work in progress (by the age of the oldest, st.RunningMillis: under
// 10 s, 1 min, 10 min, 1 h, beyond), plus 100 for each partition Lease and
// 10,000 for each role Lease (up to 99 of each counted). So a role Lease
// holder is kept over a pod with partitions, which is kept over one with
// work in progress only, the longer-running kept first. The result is at
// most 999,950.
func DeletionCost(role, partition int, st protocol.DrainStatus) int32 {
	cost := int32(0)
	switch inProgress := st.InFlight - st.Unstarted; {
	case inProgress > 0:
		cost = costWorking
		age := time.Duration(st.RunningMillis) * time.Millisecond
		for _, step := range costAges {
			if age >= step {
				cost += costWorking
			}
		}
	case st.InFlight > 0:
		cost = costUnstarted
	}
	cost += costPartition * int32(min(max(partition, 0), costMaxLeases))
	cost += costRole * int32(min(max(role, 0), costMaxLeases))
	return cost
}

// costKeeper decides when the cost on the pod is written: a higher cost at
// once (the pod became dearer: protect it now), a lower one once it has
// held for costSettle, each write within the token bucket.
type costKeeper struct {
	limiter    *rate.Limiter
	onPod      int32     // the cost on the pod
	known      bool      // onPod is known: read at start, or written
	lowerSince time.Time // since when the wanted cost has been below onPod; zero when it is not
}

func newCostKeeper() *costKeeper {
	return &costKeeper{limiter: rate.NewLimiter(rate.Every(costEvery), costBurst)}
}

// decide reports whether want is to be written now, at now.
func (k *costKeeper) decide(now time.Time, want int32) bool {
	switch {
	case k.known && want == k.onPod:
		k.lowerSince = time.Time{}
		return false
	case k.known && want < k.onPod:
		if k.lowerSince.IsZero() {
			k.lowerSince = now
		}
		if now.Sub(k.lowerSince) < costSettle {
			return false
		}
	default:
		k.lowerSince = time.Time{}
	}
	return k.limiter.AllowN(now, 1)
}

// wrote records want as written.
func (k *costKeeper) wrote(want int32) {
	k.onPod, k.known, k.lowerSince = want, true, time.Time{}
}

// keepDeletionCost keeps the pod's pod-deletion-cost at DeletionCost while
// the pod runs (phase Running; a sequence or a re-arm leaves it as it is),
// until ctx ends. Each write is a merge patch of pods/status holding only
// the annotation: a status write may carry the pod's annotations, so the
// sidecar needs no write access to the pod itself, and the chart's
// admission policy (sidecar-pod-policy.yaml) lets it change that one
// annotation, only on a pod that opted in (protocol.DeletionCostOptIn).
func (c *Coordinator) keepDeletionCost(ctx context.Context) {
	k := newCostKeeper()
	if pod, _, err := c.pods.Pod(ctx, costReadTimeout); err == nil {
		if v, err := strconv.ParseInt(pod.Annotations[corev1.PodDeletionCost], 10, 32); err == nil {
			k.onPod, k.known = int32(v), true
			c.metrics.DeletionCost.Set(float64(v)) // a restarted sidecar writes nothing while the cost stands
		}
	}
	optedOut := false             // the pod lacks protocol.DeletionCostOptIn; logged once
	var last protocol.DrainStatus // the app's last answer: kept while it does not answer
	t := c.clock.NewTicker(costPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		c.mu.Lock()
		running := c.phase == PhaseRunning
		c.mu.Unlock()
		if !running {
			continue
		}
		// The chart's admission policy refuses the write on a pod without
		// the opt-in annotation (removed from a running pod, or a sidecar
		// configured by hand): write nothing rather than be refused forever.
		if pod, _, err := c.pods.Pod(ctx, costReadTimeout); err == nil {
			if pod.Annotations[protocol.DeletionCostOptIn] != "true" {
				if !optedOut {
					c.log.Info("not writing the pod's deletion cost: setting deletion-cost is on, but the pod is not annotated "+protocol.DeletionCostOptIn+": \"true\", which the chart's admission policy requires",
						"annotation", pod.Annotations[protocol.DeletionCostOptIn])
				}
				optedOut = true
				continue
			}
			optedOut = false
		}
		rctx, cancel := context.WithTimeout(ctx, costReadTimeout)
		if st, err := c.app.Drain(rctx, 0); err == nil {
			last = st
		}
		cancel()
		role, partition := 0, 0
		for _, l := range c.Status().Leases {
			switch {
			case !l.Leader:
			case l.Kind == protocol.LeaseKindRole:
				role++
			default:
				partition++
			}
		}
		want := DeletionCost(role, partition, last)
		if !k.decide(c.clock.Now(), want) {
			continue
		}
		if err := c.writeDeletionCost(ctx, want); err != nil {
			c.metrics.DeletionCostWrites.WithLabelValues("failed").Inc()
			c.log.Error(err, "writing the pod's deletion cost failed; trying again at a later poll, within the bound on writes", "cost", want, "was", k.onPod)
			continue
		}
		c.metrics.DeletionCostWrites.WithLabelValues("written").Inc()
		c.metrics.DeletionCost.Set(float64(want))
		c.log.V(1).Info("wrote the pod's deletion cost", "cost", want, "was", k.onPod, "roleLeases", role, "partitionLeases", partition,
			"inFlight", last.InFlight, "unstarted", last.Unstarted, "runningMillis", last.RunningMillis)
		k.wrote(want)
	}
}

// writeDeletionCost patches the pod's pod-deletion-cost to cost, through
// pods/status, bounded by costWriteTimeout.
func (c *Coordinator) writeDeletionCost(ctx context.Context, cost int32) error {
	meta := map[string]any{"annotations": map[string]string{corev1.PodDeletionCost: strconv.FormatInt(int64(cost), 10)}}
	if c.s.PodUID != "" {
		meta["uid"] = c.s.PodUID // refused if the pod of this name is another
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, costWriteTimeout)
	defer cancel()
	_, err = c.phases.pods.Patch(ctx, c.s.PodName, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}
