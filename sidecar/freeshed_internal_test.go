package sidecar

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// answeredBeforeCancel sends each request whatever becomes of its context:
// a request the apiserver answered before the client's cancel reached it.
// It counts the requests it sends.
type answeredBeforeCancel struct {
	next http.RoundTripper
	sent *atomic.Int64
}

func (rt answeredBeforeCancel) RoundTrip(req *http.Request) (*http.Response, error) {
	rt.sent.Add(1)
	return rt.next.RoundTrip(req.WithContext(context.WithoutCancel(req.Context())))
}

// A shed whose election ends only after its round's sequence has started
// (its wait for the app's term, or a slow election) sends nothing to free
// the Lease: by then a re-arm may have given this pod, the same holder
// identity, a new term of it, and freeing that would free the Lease under
// the app. The Lease here names the pod as that new term's would; the
// client answers every request, as the apiserver may before a cancel
// reaches it, so only not sending keeps it.
func TestFreeShedSendsNothingOnceTheSequenceStarted(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	s, err := config.Load(config.Map(map[string]string{
		"pod-name": "pod-a", "pod-namespace": ns, "pod-uid": "uid-a", "leases": "",
		"shards": "s-0", "shard-peers": "app=shards",
		"lease-duration": "30s", "renew-deadline": "2s", "retry-period": "250ms",
		"app-url": "http://127.0.0.1:1",
	}, "test"))
	if err != nil {
		t.Fatal(err)
	}
	rc := rest.CopyConfig(env.Config)
	sent := &atomic.Int64{}
	rc.Wrap(func(next http.RoundTripper) http.RoundTripper { return answeredBeforeCancel{next: next, sent: sent} })
	c, err := New(Options{Settings: s, Leases: kubernetes.NewForConfigOrDie(rc).CoordinationV1(), Pods: env.Client.CoreV1(),
		Metrics: NewMetrics(prometheus.NewRegistry()), Logger: logr.Discard(), Token: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"})
	if err != nil {
		t.Fatal(err)
	}
	leases := env.Client.CoordinationV1().Leases(ns)
	now := metav1.NewMicroTime(time.Now())
	if _, err := leases.Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "s-0"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(s.Identity()), LeaseDurationSeconds: ptr.To[int32](30),
			AcquireTime: &now, RenewTime: &now, LeaseTransitions: ptr.To[int32](2)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := &round{shutdown: make(chan struct{}), done: make(chan struct{})}
	close(r.shutdown)
	freed, err := c.freeShed(r, "s-0")
	if freed || err != nil || sent.Load() != 0 {
		t.Errorf("freeShed after the sequence started: freed %t, error %v, %d requests sent; want none of them", freed, err, sent.Load())
	}
	l, err := leases.Get(context.Background(), "s-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != s.Identity() {
		t.Fatalf("the Lease names %q after a shed that ended once the sequence had started, want %q: freed under the pod's term", h, s.Identity())
	}
}
