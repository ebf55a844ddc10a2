package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/worker"
)

// The baseline elector leads with the Lease's leaseTransitions as fencing
// token, and at exit leaves the Lease held, as a worker without handoff
// does: its successor must wait out the lease duration.
func TestElectorLeadsAndLeavesTheLeaseHeldAtExit(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	e, err := newElector(env.Client.CoordinationV1(), ns, "jobs", "pod-a", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.beginLeading(context.Background(), "jobs"); !errors.Is(err, worker.ErrNotLeader) {
		t.Fatalf("beginLeading before the election: %v, want ErrNotLeader", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { e.run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()

	var lead worker.Leadership
	kubetest.WaitFor(t, 10*time.Second, "the elector to lead", func() bool {
		_, l, done, err := e.beginLeading(context.Background(), "jobs")
		if err != nil {
			return false
		}
		done()
		lead = l
		return true
	})
	l, err := env.Client.CoordinationV1().Leases(ns).Get(context.Background(), "jobs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	if !strings.HasPrefix(holder, "pod-a_") {
		t.Errorf("holder identity %q, want pod-a_<uuid>", holder)
	}
	if want := int64(ptr.Deref(l.Spec.LeaseTransitions, -1)); lead.FencingToken != want {
		t.Errorf("fencing token %d, want the Lease's leaseTransitions %d", lead.FencingToken, want)
	}

	cancel()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the elector did not stop within 10s of its context's end")
	}
	if _, _, _, err := e.beginLeading(context.Background(), "jobs"); !errors.Is(err, worker.ErrNotLeader) {
		t.Errorf("beginLeading after exit: %v, want ErrNotLeader", err)
	}
	l, err = env.Client.CoordinationV1().Leases(ns).Get(context.Background(), "jobs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(l.Spec.HolderIdentity, ""); got != holder {
		t.Errorf("after exit the Lease is held by %q, want still %q (not released)", got, holder)
	}
}
