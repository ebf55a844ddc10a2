package charts_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/internal/charttest"
)

// dashboardJSON is the part of files/dashboard.json these tests read
// beyond charttest.Dashboard: variables and units.
type dashboardJSON struct {
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title       string `json:"title"`
		Type        string `json:"type"`
		FieldConfig struct {
			Defaults struct {
				Unit string `json:"unit"`
			} `json:"defaults"`
			Overrides []struct {
				Matcher struct {
					ID      string `json:"id"`
					Options string `json:"options"`
				} `json:"matcher"`
				Properties []struct {
					ID    string `json:"id"`
					Value any    `json:"value"`
				} `json:"properties"`
			} `json:"overrides"`
		} `json:"fieldConfig"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// The dashboard serves many teams: it has cluster, namespace, workload,
// pod and Lease variables, in that order (each narrowing the next's
// values), and every query of the sidecars' metrics filters on each of
// them (the Lease's on lease too), the webhook's and the API server's on
// cluster, the handovers the webhook counts (per namespace) on cluster and
// namespace; a query added without them (as when panels are merged) fails
// here.
func TestDashboardVariablesFilterEveryQuery(t *testing.T) {
	raw, _ := charttest.DashboardFile(t)
	var d dashboardJSON
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range d.Templating.List {
		names = append(names, v.Name)
	}
	if want := []string{"datasource", "cluster", "namespace", "workload", "pod", "lease"}; !slices.Equal(names, want) {
		t.Errorf("variables %v; want %v", names, want)
	}
	sidecar := []string{`cluster=~"$cluster"`, `namespace=~"$namespace"`, `workload=~"$workload"`, `pod=~"$pod"`}
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			want := sidecar
			switch {
			case strings.Contains(q.Expr, "handoff_webhook_") || strings.Contains(q.Expr, "apiserver_"):
				want = sidecar[:1]
			case strings.Contains(q.Expr, "handoff_handover") || strings.Contains(q.Expr, "handoff_outcome_"):
				// Counted by the webhook from the pods' summary Events, per
				// namespace: no workload or pod label to filter on.
				want = sidecar[:2]
			case strings.Contains(q.Expr, "handoff_lease_leader"):
				want = append(slices.Clone(sidecar), `lease=~"$lease"`)
			}
			for _, w := range want {
				// Every selector of the query, not one of them.
				for _, sel := range selectors(q.Expr) {
					if !strings.Contains(sel, w) {
						t.Errorf("panel %q query %s: selector {%s} does not filter on %s", p.Title, q.RefID, sel, w)
					}
				}
			}
		}
	}
}

// selectors returns the label matchers of each handoff_ or apiserver_
// series a query reads.
func selectors(expr string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?:handoff|apiserver)_[a-z_]+(\{[^}]*\})?`).FindAllStringSubmatch(expr, -1) {
		out = append(out, strings.Trim(m[1], "{}"))
	}
	return out
}

// Rate panels say what they count: a rate times 60 is per minute (opm,
// Grafana's "ops/min"), a series of increases on such a panel is a count
// (an override), durations are seconds; no rate is left in Grafana's
// unitless "short".
func TestDashboardUnits(t *testing.T) {
	raw, _ := charttest.DashboardFile(t)
	var d dashboardJSON
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Panels {
		unit := map[string]string{}
		for _, q := range p.Targets {
			unit[q.RefID] = p.FieldConfig.Defaults.Unit
		}
		for _, o := range p.FieldConfig.Overrides {
			for _, prop := range o.Properties {
				if o.Matcher.ID == "byFrameRefID" && prop.ID == "unit" {
					unit[o.Matcher.Options] = fmt.Sprint(prop.Value)
				}
			}
		}
		for _, q := range p.Targets {
			var want string
			switch {
			case strings.Contains(q.Expr, "histogram_quantile"):
				want = "s"
			case strings.Contains(q.Expr, "rate(") && strings.HasSuffix(strings.TrimSpace(q.Expr), "* 60"):
				want = "opm"
			case strings.Contains(q.Expr, "rate("):
				want = "reqps"
			default:
				continue
			}
			if unit[q.RefID] != want {
				t.Errorf("panel %q query %s (%s): unit %q, want %q", p.Title, q.RefID, q.Expr, unit[q.RefID], want)
			}
		}
		if strings.Contains(p.Title, "per minute") && p.FieldConfig.Defaults.Unit != "opm" {
			t.Errorf("panel %q: unit %q, want opm", p.Title, p.FieldConfig.Defaults.Unit)
		}
	}
}
