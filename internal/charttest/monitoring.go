package charttest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// RuleFile is a Prometheus rule file, as the chart's files/alerts.yaml.
type RuleFile struct {
	Groups []RuleGroup `json:"groups"`
}

// RuleGroup is one group of a RuleFile.
type RuleGroup struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

// Rule is an alerting (Alert) or recording (Record) rule.
type Rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Alerts reads the chart's alert rules, files/alerts.yaml (strictly: a
// field this type lacks fails t).
func Alerts(t testing.TB) RuleFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(Chart(t), "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f RuleFile
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		t.Fatalf("files/alerts.yaml: %v", err)
	}
	return f
}

// Dashboard is the part of a Grafana dashboard's JSON the tests read.
type Dashboard struct {
	Title  string  `json:"title"`
	UID    string  `json:"uid"`
	Panels []Panel `json:"panels"`
}

// Panel is a dashboard panel: its title and its queries.
type Panel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// DashboardFile is the chart's dashboard, files/dashboard.json: its raw
// bytes and what the tests read of it.
func DashboardFile(t testing.TB) ([]byte, Dashboard) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(Chart(t), "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d Dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("files/dashboard.json: %v", err)
	}
	return raw, d
}
