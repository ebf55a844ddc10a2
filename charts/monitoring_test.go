// Package charts_test tests what the chart ships for monitoring: its alert
// rules, as a PrometheusRule, against promtool's unit tests, and its
// Grafana dashboard's queries against promtool's parser.
package charts_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/handoff-dev/handoff/internal/charttest"
)

// renderedRules renders the chart's PrometheusRule with args and returns
// its spec as a rule file.
func renderedRules(t *testing.T, args ...string) charttest.RuleFile {
	t.Helper()
	objs := charttest.Render(t, "handoff", "handoff", append([]string{"--set", "monitoring.prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml"}, args...)...)
	if len(objs) != 1 || objs[0].GetKind() != "PrometheusRule" {
		t.Fatalf("rendered %d objects, want one PrometheusRule", len(objs))
	}
	spec, err := json.Marshal(objs[0].Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	var f charttest.RuleFile
	if err := yaml.UnmarshalStrict(spec, &f); err != nil {
		t.Fatalf("the PrometheusRule's spec: %v", err)
	}
	return f
}

// The PrometheusRule the chart renders by default is files/alerts.yaml,
// and it passes files/alerts_test.yaml's unit tests (promtool test rules):
// what promtool tests is what a cluster gets.
func TestPrometheusRuleIsTheTestedRuleFile(t *testing.T) {
	file, got := charttest.Alerts(t), renderedRules(t)
	if !reflect.DeepEqual(got, file) {
		t.Errorf("the rendered PrometheusRule's groups differ from files/alerts.yaml:\n got %+v\nwant %+v", got, file)
	}
	promtool := charttest.Tool(t, "promtool")
	dir := t.TempDir()
	raw, err := yaml.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(charttest.Chart(t), "files", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"alerts.yaml": raw, "alerts_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool test rules on the rendered PrometheusRule: %v\n%s", err, out)
	}
	alerts := 0
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			alerts++
			if r.Labels["severity"] != "warning" && r.Labels["severity"] != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, r.Labels["severity"])
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s: no annotation %s", r.Alert, a)
				}
			}
			if !strings.Contains(string(tests), "alertname: "+r.Alert) {
				t.Errorf("%s: not in files/alerts_test.yaml", r.Alert)
			}
		}
	}
	if alerts == 0 {
		t.Fatal("files/alerts.yaml has no alert")
	}
}

// monitoring.prometheusRule's knobs: labels added, alerts left out, a
// `for` replaced; an alert name the chart does not have, a label that is
// not the user's to add (alertname, severity) and a duration Prometheus
// would refuse are refused, naming the value.
func TestPrometheusRuleKnobs(t *testing.T) {
	got := renderedRules(t, "--set", "monitoring.prometheusRule.labels.team=platform",
		"--set", "monitoring.prometheusRule.disabled={HandoffSidecarRestarted}", "--set", "monitoring.prometheusRule.for.HandoffShardsUnowned=5m")
	seen := map[string]charttest.Rule{}
	for _, g := range got.Groups {
		for _, r := range g.Rules {
			seen[r.Alert] = r
			if r.Labels["team"] != "platform" {
				t.Errorf("%s: labels %v, want team=platform added", r.Alert, r.Labels)
			}
		}
	}
	if _, ok := seen["HandoffSidecarRestarted"]; ok {
		t.Error("HandoffSidecarRestarted rendered, though disabled")
	}
	if f := seen["HandoffShardsUnowned"].For; f != "5m" {
		t.Errorf("HandoffShardsUnowned for %q, want 5m", f)
	}
	if f := seen["HandoffRoleLeaseWithoutHolder"].For; f != "1m" {
		t.Errorf("HandoffRoleLeaseWithoutHolder for %q, want its own 1m", f)
	}
	for set, want := range map[string][]string{
		"monitoring.prometheusRule.disabled={HandoffNoSuchAlert}":  {"monitoring.prometheusRule.disabled", "HandoffNoSuchAlert"},
		"monitoring.prometheusRule.for.HandoffNoSuchAlert=5m":      {"monitoring.prometheusRule.for", "HandoffNoSuchAlert"},
		"monitoring.prometheusRule.labels.severity=page":           {"monitoring.prometheusRule.labels", `"severity" cannot be added`},
		"monitoring.prometheusRule.labels.alertname=x":             {"monitoring.prometheusRule.labels", `"alertname" cannot be added`},
		"monitoring.prometheusRule.for.HandoffShardsUnowned=30s1m": {"HandoffShardsUnowned", "does not match pattern"},
	} {
		_, stderr, err := charttest.HelmResult(t, "template", "handoff", charttest.Chart(t), "--kube-version", charttest.KubeVersion,
			"--set", "monitoring.prometheusRule.enabled=true", "--set", set)
		for _, w := range want {
			if err == nil || !strings.Contains(string(stderr), w) {
				t.Errorf("--set %s: %v, %s; want a refusal naming %q", set, err, stderr, w)
			}
		}
	}
	// Prometheus's own durations, days included.
	if f := renderedRules(t, "--set", "monitoring.prometheusRule.for.HandoffShardsUnowned=1d12h").Groups; len(f) == 0 {
		t.Error("for 1d12h: no groups rendered")
	}
}

// dashboardQueries returns each query of files/dashboard.json by panel
// title, with Grafana's variables replaced as Grafana would for "All".
func dashboardQueries(t *testing.T, d charttest.Dashboard) map[string][]string {
	t.Helper()
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("files/dashboard.json: title %q, uid %q, %d panels; want all three", d.Title, d.UID, len(d.Panels))
	}
	out := map[string][]string{}
	vars := strings.NewReplacer("$cluster", ".*", "$namespace", ".*", "$workload", ".*", "$pod", ".*", "$lease", ".*", "$__rate_interval", "1m")
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			out[p.Title] = append(out[p.Title], vars.Replace(q.Expr))
		}
	}
	return out
}

// The dashboard's ConfigMap holds files/dashboard.json under the label
// Grafana's sidecar looks for, and every query of it parses (promtool
// check rules, each query a recording rule).
func TestDashboardQueriesParse(t *testing.T) {
	objs := charttest.Render(t, "handoff", "handoff", "--set", "monitoring.dashboard.enabled=true", "--show-only", "templates/dashboard.yaml")
	if len(objs) != 1 || objs[0].GetKind() != "ConfigMap" || objs[0].GetLabels()["grafana_dashboard"] != "1" {
		t.Fatalf("rendered %d objects, want one ConfigMap labelled grafana_dashboard: \"1\"", len(objs))
	}
	raw, d := charttest.DashboardFile(t)
	data, _ := objs[0].Object["data"].(map[string]any)
	if got, _ := data["handoff-handovers.json"].(string); got != strings.TrimRight(string(raw), "\n") {
		t.Errorf("the ConfigMap's handoff-handovers.json is not files/dashboard.json")
	}
	var rules charttest.RuleFile
	g := charttest.RuleGroup{Name: "dashboard"}
	for title, exprs := range dashboardQueries(t, d) {
		for _, e := range exprs {
			g.Rules = append(g.Rules, charttest.Rule{Record: "dashboard:query", Expr: e, Labels: map[string]string{"panel": title}})
		}
	}
	rules.Groups = append(rules.Groups, g)
	b, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(charttest.Tool(t, "promtool"), "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("the dashboard's queries do not parse: %v\n%s", err, out)
	}
}
