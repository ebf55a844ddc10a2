package charts_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/internal/charttest"
)

// relabeling is one of a PodMonitor's relabelings (the Prometheus
// Operator's RelabelConfig), action replace: the fields the chart uses.
type relabeling struct {
	SourceLabels []string `json:"sourceLabels"`
	Separator    *string  `json:"separator"`
	Regex        string   `json:"regex"`
	TargetLabel  string   `json:"targetLabel"`
	Replacement  *string  `json:"replacement"`
	Action       string   `json:"action"`
}

// apply runs the relabelings on labels as Prometheus does for action
// replace (its default): the source labels joined by the separator (";"
// by default) must match the regex (default "(.*)"), anchored at both
// ends; the target label then takes the replacement ("$1" by default),
// expanded, and is removed when that is empty.
func apply(t *testing.T, rs []relabeling, labels map[string]string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range labels {
		out[k] = v
	}
	for _, r := range rs {
		if r.Action != "" && r.Action != "replace" {
			t.Fatalf("relabeling action %q: this test knows replace only", r.Action)
		}
		sep, regex, repl := ";", "(.*)", "$1"
		if r.Separator != nil {
			sep = *r.Separator
		}
		if r.Regex != "" {
			regex = r.Regex
		}
		if r.Replacement != nil {
			repl = *r.Replacement
		}
		var vals []string
		for _, s := range r.SourceLabels {
			vals = append(vals, out[s])
		}
		re := regexp.MustCompile("^(?:" + regex + ")$")
		v := strings.Join(vals, sep)
		m := re.FindStringSubmatchIndex(v)
		if m == nil {
			continue
		}
		if got := string(re.ExpandString(nil, repl, v, m)); got != "" {
			out[r.TargetLabel] = got
		} else {
			delete(out, r.TargetLabel)
		}
	}
	return out
}

// The PodMonitor labels every series with the pod's workload, from its
// owner: a Deployment's name for a pod of a ReplicaSet it made, the
// controller's own name for any other (StatefulSet, DaemonSet, Job, a
// ReplicaSet of its own), and the pod's name for a pod without one; and
// pod_uid, as before.
func TestPodMonitorLabelsTheWorkload(t *testing.T) {
	objs := charttest.Render(t, "handoff", "handoff", "--set", "monitoring.podMonitor.enabled=true", "--show-only", "templates/monitoring.yaml")
	if len(objs) != 1 || objs[0].GetKind() != "PodMonitor" {
		t.Fatalf("rendered %d objects, want one PodMonitor", len(objs))
	}
	endpoints, _ := objs[0].Object["spec"].(map[string]any)["podMetricsEndpoints"].([]any)
	if len(endpoints) != 1 {
		t.Fatalf("%d podMetricsEndpoints, want 1", len(endpoints))
	}
	b, _ := json.Marshal(endpoints[0].(map[string]any)["relabelings"])
	var rs []relabeling
	if err := json.Unmarshal(b, &rs); err != nil {
		t.Fatal(err)
	}
	pod := func(name, kind, controller, hash string) map[string]string {
		l := map[string]string{"__meta_kubernetes_pod_name": name, "__meta_kubernetes_pod_uid": "u-" + name}
		if kind != "" {
			l["__meta_kubernetes_pod_controller_kind"] = kind
			l["__meta_kubernetes_pod_controller_name"] = controller
		}
		if hash != "" {
			l["__meta_kubernetes_pod_label_pod_template_hash"] = hash
		}
		return l
	}
	for _, tc := range []struct {
		what   string
		labels map[string]string
		want   string
	}{
		{"a Deployment's pod", pod("orders-7d9f8c6b5-x2k4q", "ReplicaSet", "orders-7d9f8c6b5", "7d9f8c6b5"), "orders"},
		{"a Deployment with dashes in its name", pod("shop-orders-api-5c4b7-abcde", "ReplicaSet", "shop-orders-api-5c4b7", "5c4b7"), "shop-orders-api"},
		{"a ReplicaSet of its own (no pod-template-hash)", pod("batch-rs-x2k4q", "ReplicaSet", "batch-rs", ""), "batch-rs"},
		{"a StatefulSet's pod", pod("ledger-2", "StatefulSet", "ledger", ""), "ledger"},
		{"a DaemonSet's pod", pod("agent-x2k4q", "DaemonSet", "agent", ""), "agent"},
		{"a Job's pod", pod("nightly-28901234-x2k4q", "Job", "nightly-28901234", ""), "nightly-28901234"},
		{"a pod without an owner", pod("debug", "", "", ""), "debug"},
	} {
		got := apply(t, rs, tc.labels)
		if got["workload"] != tc.want {
			t.Errorf("%s: workload %q, want %q", tc.what, got["workload"], tc.want)
		}
		if got["pod_uid"] != tc.labels["__meta_kubernetes_pod_uid"] {
			t.Errorf("%s: pod_uid %q, want the pod's UID", tc.what, got["pod_uid"])
		}
	}
}
