package sidecar_test

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/leaderelection"
	"github.com/handoff-dev/handoff/sidecar"
)

// A sidecar whose Lease client's budget cannot keep its Leases renewed says
// so at start: a LeaseBudgetExceeded Event on the pod naming how many it
// keeps, and the budget metrics. One whose budget is enough records no such
// Event.
func TestLeaseBudgetShortfallIsSaidAtStart(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	for _, tc := range []struct {
		name, retryPeriod string
		short             bool
	}{
		// 3 Leases renewed every 10 ms: 600 requests/s, over the ceiling.
		{"short", "10ms", true},
		{"enough", "250ms", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := env.Pod(t, ns, "pod-"+tc.name, 30)
			s, err := config.Load(config.Map(map[string]string{
				"pod-name": obj.Name, "pod-namespace": ns, "pod-uid": string(obj.UID),
				"leases":         "a-" + tc.name + ",b-" + tc.name + ",c-" + tc.name,
				"lease-duration": "3s", "renew-deadline": "2s", "retry-period": tc.retryPeriod,
				"app-url": "http://127.0.0.1:1",
			}, "test"))
			if err != nil {
				t.Fatal(err)
			}
			budget := leaderelection.ClientBudget(len(s.Leases), s.RetryPeriod)
			rc := rest.CopyConfig(env.Config)
			rc.QPS, rc.Burst = budget.QPS, budget.Burst
			leases := kubernetes.NewForConfigOrDie(rc)
			reg := prometheus.NewRegistry()
			m := sidecar.NewMetrics(reg)
			c, err := sidecar.New(sidecar.Options{Token: testToken,
				Settings: s, Leases: leases.CoordinationV1(), Pods: env.Client.CoreV1(),
				Events: recorder(t, ns), Metrics: m, Logger: testr.New(t), LeaseBudget: budget,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			c.Start(ctx)
			defer func() { cancel(); c.Wait() }()

			if got := gauge(m.LeasesConfigured); got != 3 {
				t.Errorf("handoff_leases_configured = %v, want 3", got)
			}
			if got := gauge(m.LeaseCapacity); got != float64(budget.Leases) {
				t.Errorf("handoff_lease_capacity = %v, want %d", got, budget.Leases)
			}
			if got := gauge(m.LeaseClientRateLimit); got != float64(budget.QPS) {
				t.Errorf("handoff_lease_client_rate_limit_requests_per_second = %v, want %v", got, budget.QPS)
			}
			if !tc.short {
				// The first acquisition's Event is recorded after the
				// budget's would have been.
				events(t, ns, obj.Name, sidecar.ReasonLeaseAcquired)
				list, err := env.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
					FieldSelector: "involvedObject.name=" + obj.Name + ",reason=" + sidecar.ReasonLeaseBudgetExceeded})
				if err != nil {
					t.Fatal(err)
				}
				if len(list.Items) != 0 {
					t.Errorf("LeaseBudgetExceeded Event with an ample budget: %q", list.Items[0].Message)
				}
				return
			}
			msgs := events(t, ns, obj.Name, sidecar.ReasonLeaseBudgetExceeded)
			if want := "keeps at most 2 Leases renewed within the renew deadline at retry period 10ms"; !strings.Contains(msgs[0], want) || !strings.Contains(msgs[0], "3 Leases are configured") {
				t.Errorf("LeaseBudgetExceeded Event = %q, want it to say %q and that 3 are configured", msgs[0], want)
			}
			if gauge(m.LeaseCapacity) >= gauge(m.LeasesConfigured) {
				t.Errorf("handoff_lease_capacity %v not below handoff_leases_configured %v", gauge(m.LeaseCapacity), gauge(m.LeasesConfigured))
			}
		})
	}
}

// recorder records Events in ns through the real API until the test ends.
func recorder(t *testing.T, ns string) record.EventRecorder {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kubetest.Get(t).Client.CoreV1().Events(ns)})
	t.Cleanup(b.Shutdown)
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "handoff"})
}

func gauge(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		panic(err)
	}
	return m.GetGauge().GetValue()
}
