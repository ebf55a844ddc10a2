package sidecar_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/rest"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/sidecar"
)

// refuseReleases answers 500 to the writes of a shard Lease ("s-" names;
// with leases, of the Leases whose path contains it) that free it (holder
// identity empty) while refuse is set: every one, or with once only the
// first of each Lease (the election's; the freeing of the Lease it left
// then goes through). A refused release fails, and the Lease names the pod
// until it is freed or expires.
type refuseReleases struct {
	rt      http.RoundTripper
	refuse  *atomic.Bool
	refused *atomic.Int64
	once    *sync.Map // Lease path → refused once, when set
	leases  string    // "": "/leases/s-"
}

func (r refuseReleases) RoundTrip(req *http.Request) (*http.Response, error) {
	leases := r.leases
	if leases == "" {
		leases = "/leases/s-"
	}
	if r.refuse.Load() && (req.Method == http.MethodPut || req.Method == http.MethodPatch) && strings.Contains(req.URL.Path, leases) && req.Body != nil {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		var l coordinationv1.Lease
		release := req.Method == http.MethodPut && json.Unmarshal(body, &l) == nil && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "")
		// The leftover release: a JSON patch that empties the holder.
		release = release || (req.Method == http.MethodPatch && bytes.Contains(body, []byte(`"path":"/spec/holderIdentity","value":""`)))
		if release && r.once != nil {
			_, again := r.once.LoadOrStore(req.URL.Path, true)
			release = !again
		}
		if release {
			r.refused.Add(1)
			return &http.Response{StatusCode: http.StatusInternalServerError, Status: "500 Internal Server Error",
				Header: http.Header{"Content-Type": []string{"text/plain"}}, Body: io.NopCloser(strings.NewReader("release refused by the test")),
				Request: req}, nil
		}
	}
	return r.rt.RoundTrip(req)
}

// refusingShardPod is shardPod with a Lease client whose release writes of
// shard Leases fail while the returned flag is set: every one, or with once
// the first of each Lease.
func refusingShardPod(t *testing.T, ns, name string, shards int, values map[string]string, once bool) (*pod, *atomic.Bool, *atomic.Int64) {
	t.Helper()
	refuse, refused := &atomic.Bool{}, &atomic.Int64{}
	var first *sync.Map
	if once {
		first = &sync.Map{}
	}
	p := startShardPod(t, ns, name, shards, values, func(rc *rest.Config) {
		// JSON, so the transport can read the Lease written.
		rc.ContentType, rc.AcceptContentTypes = "application/json", "application/json"
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return refuseReleases{rt: rt, refuse: refuse, refused: refused, once: first}
		})
	})
	return p, refuse, refused
}

// shedWhileRefused has pod-a lead all n shards alone, then refuses its
// release writes (all, or with once the first of each Lease) and starts
// pod-b, which must take its half within within (what says why then). It
// fails the test if a shard was led by two apps at once, and returns how
// many release writes were refused and pod-a's ShardShed Events.
func shedWhileRefused(t *testing.T, n int, values map[string]string, once bool, within time.Duration, what string) (int64, []string) {
	t.Helper()
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	terms := &shardTerms{open: map[string]*shardTerm{}}
	a, refuse, refused := refusingShardPod(t, ns, "pod-a", n, values, once)
	terms.wrap(a)
	kubetest.WaitFor(t, 20*time.Second, fmt.Sprintf("pod-a alone to lead all %d shards", n), func() bool { return converged(t, ns, n, []*pod{a}, []*pod{a}) })
	refuse.Store(true)
	b, _ := shardPod(t, ns, "pod-b", n, terms)
	kubetest.WaitFor(t, within, "pod-b to take its shards "+what, func() bool {
		return converged(t, ns, n, []*pod{a, b}, []*pod{a, b})
	})
	if o := terms.overlaps(); len(o) > 0 {
		t.Fatalf("shards led by two pods at once:\n%v", o)
	}
	return refused.Load(), events(t, ns, "pod-a", sidecar.ReasonShardShed)
}

// TestUnreleasedShedIsTakenByItsAssignedPod: pod-a's releases of the shards
// it sheds fail; they are shed all the same (released=false), and pod-b,
// to which they are assigned, takes them once the Leases expire. No shard
// is led by two apps at once.
func TestUnreleasedShedIsTakenByItsAssignedPod(t *testing.T) {
	const n = 4
	refused, shed := shedWhileRefused(t, n, nil, false, 30*time.Second, "after pod-a's unreleased Leases expire")
	if refused == 0 {
		t.Fatal("no release of pod-a was refused: the test did not test an unreleased shed")
	}
	if len(shed) != n/2 || !strings.Contains(strings.Join(shed, "\n"), "released=false") {
		t.Errorf("pod-a's ShardShed Events: %q, want %d with released=false", shed, n/2)
	}
}

// TestShedLeaseLeftNamingThePodIsFreed: the release write of pod-a's
// election fails for each shard it sheds; the Lease it left naming pod-a is
// read and freed at once, so pod-b, to which those shards are assigned,
// takes them long before their lease duration (30 s) runs out, and pod-a
// reports them released. No shard is led by two apps at once.
func TestShedLeaseLeftNamingThePodIsFreed(t *testing.T) {
	const n = 4
	refused, shed := shedWhileRefused(t, n, map[string]string{"lease-duration": "30s", "renew-deadline": "2s"}, true,
		15*time.Second, "freed by pod-a after its failed releases (their lease duration is 30s)")
	if refused != n/2 {
		t.Fatalf("%d release writes refused, want %d: one per shed shard", refused, n/2)
	}
	if len(shed) != n/2 || strings.Contains(strings.Join(shed, "\n"), "released=false") {
		t.Errorf("pod-a's ShardShed Events: %q, want %d with released=true", shed, n/2)
	}
}

// TestStopDuringAnUnreleasedShedsLeaseWait: the sidecar whose context ends
// while an unreleased shed shard still counts for a lease duration (30 s
// here) ends at once, not at the end of that wait.
func TestStopDuringAnUnreleasedShedsLeaseWait(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	const n = 2
	terms := &shardTerms{open: map[string]*shardTerm{}}
	a, refuse, _ := refusingShardPod(t, ns, "pod-a", n, map[string]string{"lease-duration": "30s", "renew-deadline": "2s"}, false)
	kubetest.WaitFor(t, 20*time.Second, "pod-a alone to lead both shards", func() bool { return converged(t, ns, n, []*pod{a}, []*pod{a}) })
	refuse.Store(true)
	shardPod(t, ns, "pod-b", n, terms)
	kubetest.WaitFor(t, 20*time.Second, "pod-a's unreleased shed", func() bool {
		return strings.Contains(strings.Join(events(t, ns, "pod-a", sidecar.ReasonShardShed), "\n"), "released=false")
	})
	stopped := make(chan struct{})
	go func() { a.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("pod-a's sidecar did not end within 10s of its context's end: its shed waits out the lease duration (30s)")
	}
}
