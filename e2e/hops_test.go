//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/outcome"
)

var releasedAt = regexp.MustCompile(`released at (\S+), (\S+) after the shutdown started`)

// hopsOf reads the hops of p's handover to its successor.
func (r *rolloutRun) hopsOf(t *testing.T, p *replacedPod) handoverHops {
	t.Helper()
	h := handoverHops{termination: p.terminating}
	ctx := context.Background()
	events, err := cluster.kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + p.name + ",reason=LeaseReleased"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if !strings.Contains(e.Message, "Lease "+r.lease+" ") {
			continue
		}
		if m := releasedAt.FindStringSubmatch(e.Message); m != nil {
			at, err1 := time.Parse(time.RFC3339Nano, m[1])
			took, err2 := time.ParseDuration(m[2])
			if err1 == nil && err2 == nil {
				h.released, h.started = at, at.Add(-took)
			}
		}
	}
	sequenceHops(t, p.name, r.lease, &h)
	r.rec.mu.Lock()
	for _, o := range r.rec.holders {
		if o.holder == p.successor && o.renewed.After(h.termination.Add(-time.Second)) {
			h.acquired = o.renewed
			break
		}
	}
	r.rec.mu.Unlock()
	h.told = appToldAt(t, podOf(p.successor), r.lease, h.acquired)
	return h
}

var summaryStarted = regexp.MustCompile(`\(trigger \S+ at (\S+)\)`)

// sequenceHops sets h's hops of the leaving sidecar's step 5 for lease
// from the summary of pod's ShutdownFinished Event (the sequence that
// started nearest after h.termination less a second; its start to the
// nanosecond from the Event's message), and h.started if not set yet.
func sequenceHops(t *testing.T, pod, lease string, h *handoverHops) {
	t.Helper()
	events, err := cluster.kube.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + pod + ",reason=" + outcome.Reason})
	if err != nil {
		t.Fatal(err)
	}
	var best *outcome.LeaseResult
	var started time.Time
	for _, e := range events.Items {
		m := summaryStarted.FindStringSubmatch(e.Message)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil || at.Before(h.termination.Add(-time.Second)) || (!started.IsZero() && at.After(started)) {
			continue
		}
		s, err := outcome.Decode(e.Annotations[outcome.Annotation])
		if err != nil {
			t.Logf("pod %s's %s Event: %v", pod, outcome.Reason, err)
			continue
		}
		for i := range s.Leases {
			if s.Leases[i].Lease == lease {
				best, started = &s.Leases[i], at
			}
		}
	}
	if best == nil {
		return
	}
	if h.started.IsZero() {
		h.started = started
	}
	at := func(hop outcome.Hop) time.Time {
		sec, ok := best.Hops[hop]
		if !ok {
			return time.Time{}
		}
		return started.Add(time.Duration(sec * float64(time.Second)))
	}
	h.revokeSent, h.revokeAcked = at(outcome.HopRevokeSent), at(outcome.HopRevokeAcked)
	h.picked, h.gaveUp = at(outcome.HopSuccessorPicked), at(outcome.HopSuccessorGivenUp)
	h.releaseSent, h.releaseAcked = at(outcome.HopReleaseSent), at(outcome.HopReleaseAcked)
	h.successor = best.Successor
}

// appToldAt is the first time after after at which pod's sidecar logged
// that it told its app it leads lease; zero if not found.
func appToldAt(t *testing.T, pod, lease string, after time.Time) time.Time {
	t.Helper()
	raw, err := cluster.kube.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: "handoff"}).DoRaw(context.Background())
	if err != nil {
		t.Logf("logs of %s's sidecar: %v", pod, err)
		return time.Time{}
	}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		var line struct {
			Msg   string `json:"msg"`
			Lease string `json:"lease"`
			Told  string `json:"told"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "app told it leads" || line.Lease != lease {
			continue
		}
		if at, err := time.Parse(time.RFC3339Nano, line.Told); err == nil && !at.Before(after) {
			return at
		}
	}
	return time.Time{}
}

// hopsTable prints hops, one line per hop, each with its time from the
// previous one and from the termination start. The revoke and the pick run
// beside each other: a pick that ends before the revoke's acknowledgement
// shows a negative step. A hop the leaving sidecar did not record (its
// revoke when the app was never told it leads, a pick not looked for, or a
// sidecar older than the summary's hops) is left out; the sequence's start
// and the later hops are "not found" when missing.
func hopsTable(h handoverHops) string {
	var b strings.Builder
	prev := h.termination
	pick, picked := "→ the successor picked ("+h.successor+")", h.picked
	if !h.gaveUp.IsZero() {
		pick, picked = "→ the release stopped waiting for the successor's pick", h.gaveUp
	}
	released, releasedName := h.releaseAcked, "→ the release write acknowledged (the Lease free)"
	if released.IsZero() {
		released, releasedName = h.released, "→ the Lease released (after the app acknowledged the revoke)"
	}
	for _, hop := range []struct {
		name     string
		at       time.Time
		optional bool
	}{
		{"termination start → the leaving sidecar's sequence started", h.started, false},
		{"→ the revoke sent to the leaving app", h.revokeSent, true},
		{"→ the leaving app acknowledged the revoke", h.revokeAcked, true},
		{pick, picked, true},
		{"→ the release write sent", h.releaseSent, true},
		{releasedName, released, false},
		{"→ the successor's acquiring write", h.acquired, false},
		{"→ the successor's app told it leads", h.told, false},
	} {
		if hop.at.IsZero() && hop.optional && !prev.IsZero() {
			continue
		}
		if hop.at.IsZero() || prev.IsZero() {
			fmt.Fprintf(&b, "  %-62s %10s\n", hop.name, "not found")
			prev = time.Time{}
			continue
		}
		fmt.Fprintf(&b, "  %-62s %+8.1f ms  (%.1f ms from termination start)\n", hop.name,
			float64(hop.at.Sub(prev).Microseconds())/1000, float64(hop.at.Sub(h.termination).Microseconds())/1000)
		prev = hop.at
	}
	return b.String()
}

// leaseWriteFloor measures n updates of a scratch Lease from the test
// process, one after another: the round trip of an empty Lease write on
// this cluster in this run, the floor of each write of a handover. It
// returns the median and the largest.
func leaseWriteFloor(t *testing.T, n int) (p50, maxd time.Duration) {
	t.Helper()
	ctx := context.Background()
	// A client of its own with no client-side rate limit (QPS -1): the
	// suite's, at client-go's default 5 per second, would time its own
	// throttle (200 ms a write in a row), not the apiserver.
	cfg, err := clientcmd.BuildConfigFromFlags("", cluster.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS = -1
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	leases := kube.CoordinationV1().Leases(namespace)
	l, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{GenerateName: "floor-"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("floor"), LeaseDurationSeconds: ptr.To[int32](15)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = leases.Delete(ctx, l.Name, metav1.DeleteOptions{}) }()
	var ds []time.Duration
	for range n {
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		start := time.Now()
		if l, err = leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)-1]
}
