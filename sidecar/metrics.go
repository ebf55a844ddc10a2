package sidecar

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/protocol"
)

// Results of a Lease's release at shutdown, the label result of
// handoff_lease_releases_total.
const (
	ReleaseReleased  = "released"   // released: a successor may take it at once
	ReleaseWithheld  = "withheld"   // left to expire: the app did not confirm its leader work stopped
	ReleaseFailed    = "failed"     // not released: the successor waits for the lease duration
	ReleaseNotLeader = "not_leader" // this pod did not hold it
)

// Metrics are the sidecar's Prometheus metrics, all prefixed handoff_.
type Metrics struct {
	Leader         *prometheus.GaugeVec     // handoff_lease_leader{lease,kind}: 1 while this pod holds the Lease
	Acquisitions   *prometheus.CounterVec   // handoff_lease_acquisitions_total{lease}
	Releases       *prometheus.CounterVec   // handoff_lease_releases_total{lease,result}
	Shutdowns      *prometheus.CounterVec   // handoff_shutdowns_total{outcome}
	StepSeconds    *prometheus.HistogramVec // handoff_shutdown_step_seconds{step}: seconds from trigger to step
	ClaimsReturned prometheus.Counter       // handoff_claims_returned_total
	ClaimsLeft     prometheus.Counter       // handoff_claims_unfinished_at_deadline_total
	// ClaimsUnstarted is handoff_claims_unstarted_at_stop_claiming_total.
	ClaimsUnstarted prometheus.Counter
	// AppRequestSeconds is handoff_app_request_duration_seconds{call,result}:
	// each call to the app's API, in seconds, by call (stop-claiming, drain,
	// return, leadership, revoke) and result (ok, error, gone); its _count
	// counts the calls.
	AppRequestSeconds *prometheus.HistogramVec
	// Coordinating is handoff_coordinating: 1 while the elections run and a
	// preStop would start a sequence that hands over; 0 during a sequence and
	// after one until the sidecar re-arms (or for good, once the pod leaves).
	Coordinating prometheus.Gauge
	Rearms       prometheus.Counter // handoff_rearms_total: rounds of elections rejoined after a worker restart
	// The Lease client's budget, set at start: handoff_leases_configured,
	// handoff_lease_capacity (Leases the budget keeps renewed within the
	// renew deadline; below handoff_leases_configured, Leases will be lost)
	// and handoff_lease_client_rate_limit_requests_per_second.
	LeasesConfigured, LeaseCapacity, LeaseClientRateLimit prometheus.Gauge
	// ShardShare is handoff_shard_share: this pod's fair share of the
	// shard set, ceil(N/M) for the M peers up (0 while it is not one).
	ShardShare prometheus.Gauge
	// ShardsShed is handoff_shards_shed_total: shards this pod held and
	// released while running, as they were assigned to another pod.
	ShardsShed prometheus.Counter
	// DeletionCost is handoff_deletion_cost: the pod-deletion-cost this
	// sidecar last wrote on its pod (setting deletion-cost; DeletionCost).
	DeletionCost prometheus.Gauge
	// DeletionCostWrites is handoff_deletion_cost_writes_total{result}:
	// writes of the pod's deletion cost, written or failed.
	DeletionCostWrites *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "handoff_lease_leader", Help: "1 while this pod holds the Lease, else 0; kind is role (one holder at a time) or partition (a shard).",
		}, []string{"lease", "kind"}),
		Acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "handoff_lease_acquisitions_total", Help: "Terms begun as holder of the Lease.",
		}, []string{"lease"}),
		Releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "handoff_lease_releases_total", Help: "Lease releases at shutdown, by result (released, withheld, failed, not_leader).",
		}, []string{"lease", "result"}),
		Shutdowns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "handoff_shutdowns_total", Help: "Shutdown sequences run, by drain outcome.",
		}, []string{"outcome"}),
		StepSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "handoff_shutdown_step_seconds", Help: "Seconds from the shutdown trigger to each step.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"step"}),
		ClaimsReturned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "handoff_claims_returned_total", Help: "Claims the app handed back at the drain deadline.",
		}),
		ClaimsLeft: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "handoff_claims_unfinished_at_deadline_total", Help: "Claims still in flight at the drain deadline.",
		}),
		ClaimsUnstarted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "handoff_claims_unstarted_at_stop_claiming_total", Help: "Claims held and not started at stop-claiming (DrainStatus.unstarted), which the app hands back at once.",
		}),
		AppRequestSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "handoff_app_request_duration_seconds", Help: "Seconds each call to the app's API took, by call (stop-claiming, drain, return, leadership, revoke) and result (ok, error, gone). A drain call waits up to 5 s for the app to drain.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"call", "result"}),
	}
	m.Coordinating = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "handoff_coordinating",
		Help: "1 while the elections run and a preStop would hand over; 0 during a shutdown sequence and after one until the sidecar re-arms.",
	})
	m.Rearms = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "handoff_rearms_total", Help: "Times the sidecar rejoined its elections after a kill of the worker container in a pod that was not being deleted.",
	})
	m.LeasesConfigured = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "handoff_leases_configured", Help: "Leases this pod competes for.",
	})
	m.LeaseCapacity = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "handoff_lease_capacity",
		Help: "Leases the Lease client's rate budget keeps renewed within the renew deadline; fewer than handoff_leases_configured: Leases will be lost.",
	})
	m.LeaseClientRateLimit = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "handoff_lease_client_rate_limit_requests_per_second", Help: "The Lease client's rate budget, requests per second.",
	})
	m.ShardShare = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "handoff_shard_share", Help: "This pod's fair share of the shard set, ceil(N/M) for the M peers up; 0 while it is not one of them.",
	})
	m.ShardsShed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "handoff_shards_shed_total", Help: "Shards this pod held and released while running, because they were assigned to another pod.",
	})
	m.DeletionCost = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "handoff_deletion_cost", Help: "The pod-deletion-cost this sidecar last wrote on its pod (setting deletion-cost): 0 idle, 1 claims held unstarted, 10 to 50 work in progress by its age, plus 100 per partition Lease and 10000 per role Lease held.",
	})
	m.DeletionCostWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "handoff_deletion_cost_writes_total", Help: "Writes of the pod's pod-deletion-cost annotation (setting deletion-cost), by result (written, failed).",
	}, []string{"result"})
	// Counters that alerts read exist at 0 from the start: a rate over a
	// series that appears already at 1 (a pod's only sequence) sees no
	// increase.
	for _, o := range protocol.Outcomes() {
		m.Shutdowns.WithLabelValues(string(o))
	}
	for _, step := range protocol.Steps() {
		m.StepSeconds.WithLabelValues(string(step))
	}
	reg.MustRegister(m.ShardShare, m.ShardsShed, m.Leader, m.Acquisitions, m.Releases, m.Shutdowns, m.StepSeconds, m.ClaimsReturned, m.ClaimsLeft, m.ClaimsUnstarted, m.AppRequestSeconds,
		m.Coordinating, m.Rearms, m.LeasesConfigured, m.LeaseCapacity, m.LeaseClientRateLimit, m.DeletionCost, m.DeletionCostWrites)
	return m
}

// exportLeases exports, before any election runs, each Lease of s (the
// Leases and every shard of the shard set) as not held
// (handoff_lease_leader 0) and with no failed release
// (handoff_lease_releases_total{result="failed"} 0): a Lease no running pod
// holds shows as 0 on every candidate, not as no series, and an alert sees
// a pod's first failed release.
func (m *Metrics) exportLeases(s *config.Settings) {
	for _, name := range s.Leases {
		kind := protocol.LeaseKindPartition
		if s.IsRole(name) {
			kind = protocol.LeaseKindRole
		}
		m.Leader.WithLabelValues(name, string(kind)).Set(0)
		m.Releases.WithLabelValues(name, ReleaseFailed)
	}
	for _, name := range s.Shards {
		m.Leader.WithLabelValues(name, string(protocol.LeaseKindPartition)).Set(0)
		m.Releases.WithLabelValues(name, ReleaseFailed)
	}
}

// appResult records a call to the app that took took and ended with err.
func (m *Metrics) appResult(call string, took time.Duration, err error) {
	result := "ok"
	switch {
	case protocol.IsAppGone(err):
		result = "gone"
	case err != nil:
		result = "error"
	}
	m.AppRequestSeconds.WithLabelValues(call, result).Observe(took.Seconds())
}
