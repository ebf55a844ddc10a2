package sidecar

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/clock"

	"github.com/handoff-dev/handoff/protocol"
)

// Bounds of the writes of the pod condition.
const (
	// phaseWriteTimeout bounds each write.
	phaseWriteTimeout = 2 * time.Second
	// phaseRetryFirst and phaseRetryMax: a failed write is tried again
	// after phaseRetryFirst, doubling up to phaseRetryMax, until it is
	// written or a newer phase replaces it.
	phaseRetryFirst = 250 * time.Millisecond
	phaseRetryMax   = 5 * time.Second
)

// phasePublisher writes one condition of the sidecar's on its own pod's
// status: its phase as the condition protocol.PodConditionCoordinating
// (status True while Running, else False; reason the phase; message what
// it means now), so that `handoff status` reads it from the API server
// without a port-forward; or, with a shard set, the shards it holds as the
// condition protocol.PodConditionShards (setHeld), which its peers read from
// their watch of the pods (docs/shards.md).
// Writes never hold up the sequence: set only records the wanted phase;
// one goroutine writes the latest one (a phase that a newer one replaced
// before it was written is skipped), each write bounded by
// phaseWriteTimeout and a failed one tried again with backoff.
//
// A write is a strategic merge patch of pods/status that holds this one
// condition: the kubelet keeps conditions it does not own when it writes
// the pod's status, and the chart's admission policy
// (sidecar-pod-policy.yaml) lets a sidecar's token change these two
// conditions of its own pod and nothing else of any pod's status.
type phasePublisher struct {
	pods  corev1client.PodInterface
	name  string
	clock clock.Clock
	log   logr.Logger

	mu      sync.Mutex
	want    corev1.PodCondition
	seq     int // of want: each set adds one
	written int // the seq last written
	wake    chan struct{}
	synced  chan struct{} // closed once written == seq; then replaced
}

func newPhasePublisher(pods corev1client.PodInterface, name string, clk clock.Clock, log logr.Logger) *phasePublisher {
	return &phasePublisher{pods: pods, name: name, clock: clk, log: log, wake: make(chan struct{}, 1), synced: make(chan struct{})}
}

// set records phase, with message, as the one to write.
func (p *phasePublisher) set(phase protocol.Phase, message string) {
	status := corev1.ConditionFalse
	if phase == protocol.PhaseRunning {
		status = corev1.ConditionTrue
	}
	p.mu.Lock()
	p.want = corev1.PodCondition{Type: protocol.PodConditionCoordinating, Status: status, Reason: string(phase), Message: message,
		LastTransitionTime: metav1.NewTime(p.clock.Now())}
	p.seq++
	p.mu.Unlock()
	poke(p.wake)
}

// setHeld records the shards the pod holds, as shard.EncodeHeld's text, as
// the condition protocol.PodConditionShards to write (status True, reason
// protocol.ReasonShardsHeld); nothing when it is the one last recorded.
func (p *phasePublisher) setHeld(text string) {
	p.mu.Lock()
	if p.seq > 0 && p.want.Message == text {
		p.mu.Unlock()
		return
	}
	p.want = corev1.PodCondition{Type: protocol.PodConditionShards, Status: corev1.ConditionTrue, Reason: protocol.ReasonShardsHeld, Message: text,
		LastTransitionTime: metav1.NewTime(p.clock.Now())}
	p.seq++
	p.mu.Unlock()
	poke(p.wake)
}

// run writes each phase set until ctx ends.
func (p *phasePublisher) run(ctx context.Context) {
	retry := time.Duration(0)
	for {
		var after <-chan time.Time
		if retry > 0 {
			after = p.clock.After(retry)
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-after:
		}
		p.mu.Lock()
		want, seq := p.want, p.seq
		done := p.written == seq
		p.mu.Unlock()
		if done {
			retry = 0
			continue
		}
		if err := p.write(ctx, want); err != nil {
			retry = min(max(2*retry, phaseRetryFirst), phaseRetryMax)
			p.log.V(1).Info("pod condition not written; trying again", "condition", want.Type, "phase", want.Reason, "in", retry.String(), "reason", err.Error())
			continue
		}
		retry = 0
		p.mu.Lock()
		p.written = seq
		if p.written == p.seq {
			close(p.synced)
			p.synced = make(chan struct{})
		}
		p.mu.Unlock()
	}
}

func (p *phasePublisher) write(ctx context.Context, c corev1.PodCondition) error {
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{c}}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, phaseWriteTimeout)
	defer cancel()
	_, err = p.pods.Patch(ctx, p.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "handoff-sidecar"}, "status")
	return err
}

// wait waits up to d for the latest phase set to be written, and reports
// whether it was.
func (p *phasePublisher) wait(d time.Duration) bool {
	p.mu.Lock()
	if p.written == p.seq {
		p.mu.Unlock()
		return true
	}
	synced := p.synced
	p.mu.Unlock()
	t := p.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-synced:
		return true
	case <-t.C():
		return false
	}
}
