package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// floor is the parts' own latency, measured on a Lease of its own while the
// handovers run: what a handover cannot go below on this apiserver.
type floor struct {
	write       []time.Duration // a PUT of the Lease, sent -> acknowledged
	event       []time.Duration // that PUT acknowledged -> its watch event received
	sentToEvent []time.Duration // that PUT sent -> its watch event received
	// path is a handover with nothing but the parts: a write acknowledged
	// (the release), its watch event received, and a write sent at once
	// (the acquire) acknowledged.
	path []time.Duration
	// fsync is a 4 KiB write and fsync of a file in the temporary
	// directory, where envtest's etcd keeps its data. It is not in the
	// writes above: envtest runs etcd with --unsafe-no-fsync. A real etcd
	// syncs its WAL before answering a write, and would add about this.
	fsync []time.Duration
}

// measureFsync writes 4 KiB to a file in os.TempDir and syncs it, at
// random intervals, until ctx ends.
func measureFsync(ctx context.Context) ([]time.Duration, error) {
	f, err := os.CreateTemp("", "takeover-fsync-*")
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close(); _ = os.Remove(f.Name()) }()
	buf := make([]byte, 4096)
	var out []time.Duration
	for {
		select {
		case <-ctx.Done():
			return out, nil
		case <-time.After(50*time.Millisecond + rand.N(200*time.Millisecond)):
		}
		start := time.Now()
		if _, err := f.WriteAt(buf, 0); err != nil {
			return out, err
		}
		if err := f.Sync(); err != nil {
			return out, err
		}
		out = append(out, time.Since(start))
	}
}

// measureFloor writes a Lease of its own over and over (a release-like
// write, then at once after its watch event an acquire-like one), at random
// intervals, until ctx ends, through a client built from cfg as the
// candidates' are, watching it with a raw watch (field selector on its name)
// as a standby's informer does.
func measureFloor(ctx context.Context, cfg *rest.Config) (fl floor, err error) {
	var (
		fsync    []time.Duration
		fsyncErr error
		fsyncs   sync.WaitGroup
	)
	fsyncs.Go(func() { fsync, fsyncErr = measureFsync(ctx) })
	defer func() { fsyncs.Wait(); fl.fsync, err = fsync, errors.Join(err, fsyncErr) }()
	leases := kubernetes.NewForConfigOrDie(cfg).CoordinationV1().Leases(namespace)
	name := "floor"
	l, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("floor-a"), LeaseDurationSeconds: ptr.To[int32](15)},
	}, metav1.CreateOptions{})
	if err != nil {
		return fl, err
	}
	w, err := leases.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: l.ResourceVersion})
	if err != nil {
		return fl, err
	}
	defer w.Stop()
	// write sends l with holder and a new renewTime, and returns the answer
	// with when it was sent and acknowledged.
	write := func(holder string) (time.Time, time.Time, error) {
		l.Spec.HolderIdentity = ptr.To(holder)
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		sent := time.Now()
		out, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		acked := time.Now()
		if err == nil {
			l = out
			fl.write = append(fl.write, acked.Sub(sent))
		}
		return sent, acked, err
	}
	// eventOf waits for the watch event of resource version rv.
	eventOf := func(rv string) (time.Time, error) {
		for {
			select {
			case <-ctx.Done():
				return time.Time{}, ctx.Err()
			case e, ok := <-w.ResultChan():
				if !ok {
					return time.Time{}, errors.New("floor: the watch ended")
				}
				if e.Type == watch.Error {
					return time.Time{}, fmt.Errorf("floor: watch error %v", e.Object)
				}
				if got, ok := e.Object.(*coordinationv1.Lease); ok && got.ResourceVersion == rv {
					return time.Now(), nil
				}
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return fl, nil
		case <-time.After(50*time.Millisecond + rand.N(200*time.Millisecond)):
		}
		sent, acked, err := write("")
		if err != nil {
			return fl, ctxOr(ctx, err)
		}
		seen, err := eventOf(l.ResourceVersion)
		if err != nil {
			return fl, ctxOr(ctx, err)
		}
		fl.event = append(fl.event, seen.Sub(acked))
		fl.sentToEvent = append(fl.sentToEvent, seen.Sub(sent))
		_, acked2, err := write("floor-b")
		if err != nil {
			return fl, ctxOr(ctx, err)
		}
		fl.path = append(fl.path, acked2.Sub(acked))
		if _, err := eventOf(l.ResourceVersion); err != nil {
			return fl, ctxOr(ctx, err)
		}
	}
}

// ctxOr is nil when ctx has ended (the measurement stopped mid-probe),
// else err.
func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
