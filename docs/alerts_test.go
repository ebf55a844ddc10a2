package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/internal/charttest"
)

// targetLabels are the labels a scrape adds to every series (the
// Prometheus Operator's PodMonitor and ServiceMonitor), beside a metric's
// own; le is a histogram bucket's; pod_uid and workload are the chart's
// PodMonitor's relabelings; cluster is the external label of a
// Prometheus that scrapes one cluster of many (the dashboard's variable,
// which matches series without it too).
var targetLabels = []string{"namespace", "pod", "instance", "job", "container", "endpoint", "service", "le", "pod_uid", "workload", "cluster"}

// externalMetrics are the metrics the alerts and the dashboard read that
// handoff does not export: the API server's and the Go client's.
var externalMetrics = map[string][]string{
	"apiserver_admission_webhook_fail_open_count": {"name", "type"},
	// The chart's require-injection policy's refusals (webhook.requireInjection).
	"apiserver_validating_admission_policy_check_total": {"policy", "policy_binding", "error_type", "enforcement_action"},
	"process_start_time_seconds":                        {},
}

// monitoringQueries returns every PromQL expression of the chart's alert
// rules and of its dashboard, each with where it is from.
func monitoringQueries(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, g := range charttest.Alerts(t).Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = r.Expr
		}
	}
	_, d := charttest.DashboardFile(t)
	for _, p := range d.Panels {
		for i, q := range p.Targets {
			out["dashboard panel "+p.Title+" #"+string(rune('A'+i))] = q.Expr
		}
	}
	return out
}

// Every metric the alerts and the dashboard read is one the sidecar or the
// webhook registers (a histogram through its _bucket, _count or _sum), or
// a named external one, and every label they match on is one it has: a
// query of a renamed metric or a dropped label would return nothing, and
// its alert never fire.
func TestAlertsAndDashboardReadExportedMetrics(t *testing.T) {
	code := handoffMetrics(t)
	selector := regexp.MustCompile(`\b([a-z_]+)\{([^}]*)\}|\b(handoff_[a-z_]+)\b`)
	matcher := regexp.MustCompile(`([a-z_]+)\s*(?:=~|!~|!=|=)`)
	for where, expr := range monitoringQueries(t) {
		for _, m := range selector.FindAllStringSubmatch(expr, -1) {
			name, body := m[1], m[2]
			if name == "" {
				name = m[3]
			}
			labels, ok := externalMetrics[name]
			if !ok {
				base := name
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if l, found := code[strings.TrimSuffix(name, suffix)]; found && strings.HasSuffix(name, suffix) {
						base, labels, ok = strings.TrimSuffix(name, suffix), l, true
					}
				}
				if !ok {
					labels, ok = code[base]
				}
			}
			if !ok {
				t.Errorf("%s reads %s, which neither the sidecar nor the webhook exports", where, name)
				continue
			}
			for _, l := range matcher.FindAllStringSubmatch(body, -1) {
				if !slices.Contains(labels, l[1]) && !slices.Contains(targetLabels, l[1]) {
					t.Errorf("%s matches %s on label %s, which it does not have (labels %v)", where, name, l[1], labels)
				}
			}
		}
	}
}

// Every alert's runbook_url is a section of docs/runbooks.md, and every
// section of it is an alert's.
func TestEveryAlertHasARunbook(t *testing.T) {
	rules := charttest.Alerts(t)
	page, err := os.ReadFile(filepath.Join(root, "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (\S+)$`).FindAllStringSubmatch(string(page), -1) {
		sections[m[1]] = false
	}
	const base = "https://github.com/handoff-dev/handoff/blob/main/docs/runbooks.md#"
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			url := r.Annotations["runbook_url"]
			if want := base + strings.ToLower(r.Alert); url != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, url, want)
			}
			if _, ok := sections[r.Alert]; !ok {
				t.Errorf("%s: no section ## %s in docs/runbooks.md", r.Alert, r.Alert)
			}
			sections[r.Alert] = true
		}
	}
	for s, used := range sections {
		if !used {
			t.Errorf("docs/runbooks.md has a section %s, which no alert has", s)
		}
	}
}
