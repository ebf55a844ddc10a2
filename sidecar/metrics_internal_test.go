package sidecar

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/handoff-dev/handoff/config"
)

// The series alerts read exist at 0 before anything happened: a rate over
// a series that first appears at 1 sees no increase, and a Lease no pod
// holds must show as 0 on its candidates, not as no series.
func TestMetricsExportAlertedSeriesAtZero(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	m.exportLeases(&config.Settings{Leases: []string{"orders", "cron"}, RoleLeases: []string{"cron"}, Shards: []string{"shard-0", "shard-1"}})
	want := `
# HELP handoff_lease_leader 1 while this pod holds the Lease, else 0; kind is role (one holder at a time) or partition (a shard).
# TYPE handoff_lease_leader gauge
handoff_lease_leader{kind="partition",lease="orders"} 0
handoff_lease_leader{kind="partition",lease="shard-0"} 0
handoff_lease_leader{kind="partition",lease="shard-1"} 0
handoff_lease_leader{kind="role",lease="cron"} 0
# HELP handoff_lease_releases_total Lease releases at shutdown, by result (released, withheld, failed, not_leader).
# TYPE handoff_lease_releases_total counter
handoff_lease_releases_total{lease="cron",result="failed"} 0
handoff_lease_releases_total{lease="orders",result="failed"} 0
handoff_lease_releases_total{lease="shard-0",result="failed"} 0
handoff_lease_releases_total{lease="shard-1",result="failed"} 0
# HELP handoff_shutdowns_total Shutdown sequences run, by drain outcome.
# TYPE handoff_shutdowns_total counter
handoff_shutdowns_total{outcome="Abandoned"} 0
handoff_shutdowns_total{outcome="AppGone"} 0
handoff_shutdowns_total{outcome="Canceled"} 0
handoff_shutdowns_total{outcome="Drained"} 0
handoff_shutdowns_total{outcome="Returned"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "handoff_lease_leader", "handoff_lease_releases_total", "handoff_shutdowns_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "handoff_shutdown_step_seconds"); err != nil || n != 8 {
		t.Errorf("handoff_shutdown_step_seconds: %d series (%v), want one per step, 8", n, err)
	}
}
