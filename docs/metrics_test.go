package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/version"
	"github.com/handoff-dev/handoff/webhook"
	"github.com/handoff-dev/handoff/webhook/outcomes"
)

// collectors records what is registered with it.
type collectors []prometheus.Collector

func (c *collectors) Register(x prometheus.Collector) error   { *c = append(*c, x); return nil }
func (c *collectors) MustRegister(xs ...prometheus.Collector) { *c = append(*c, xs...) }
func (c *collectors) Unregister(prometheus.Collector) bool    { return false }

// handoffMetrics returns every handoff_ metric the sidecar and the webhook
// register, with its label names (variable and constant), sorted.
func handoffMetrics(t *testing.T) map[string][]string {
	t.Helper()
	var cs collectors
	sidecar.NewMetrics(&cs)
	webhook.NewInjector(inject.Options{}, &cs, logr.Discard())
	outcomes.NewMetrics(&cs)
	cs = append(cs, version.NewBuildInfo("sidecar"))
	descs := make(chan *prometheus.Desc, 256)
	for _, c := range cs {
		c.Describe(descs)
	}
	close(descs)
	name := regexp.MustCompile(`fqName: "([^"]+)"`)
	label := regexp.MustCompile(`(?:constLabels|variableLabels): \{([^}]*)\}`)
	out := map[string][]string{}
	for d := range descs {
		s := d.String()
		m := name.FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("no fqName in %s", s)
		}
		labels := []string{}
		for _, l := range label.FindAllStringSubmatch(s, -1) {
			for kv := range strings.SplitSeq(l[1], ",") {
				if k, _, _ := strings.Cut(kv, "="); strings.TrimSpace(k) != "" {
					labels = append(labels, strings.TrimSpace(k))
				}
			}
		}
		sort.Strings(labels)
		out[m[1]] = labels
	}
	return out
}

// docs/monitoring.md's metrics table lists every handoff_ metric the
// sidecar and the webhook register, with their labels, and no other.
func TestMonitoringDocListsEveryMetric(t *testing.T) {
	code := handoffMetrics(t)
	doc := map[string][]string{}
	row := regexp.MustCompile("(?m)^\\| `(handoff_[a-z_]+)` \\| [a-z]+ \\|([^|]*)\\|")
	backticked := regexp.MustCompile("`([a-z_]+)`")
	parens := regexp.MustCompile(`\([^)]*\)`)
	page, err := os.ReadFile(filepath.Join(root, "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range row.FindAllStringSubmatch(string(page), -1) {
		labels := []string{}
		for _, l := range backticked.FindAllStringSubmatch(parens.ReplaceAllString(m[2], ""), -1) {
			labels = append(labels, l[1])
		}
		sort.Strings(labels)
		doc[m[1]] = labels
	}
	if len(doc) == 0 {
		t.Fatal("docs/monitoring.md: no metrics table rows found")
	}
	for n, labels := range code {
		if !strings.HasPrefix(n, "handoff_") {
			continue
		}
		got, ok := doc[n]
		switch {
		case !ok:
			t.Errorf("docs/monitoring.md does not list %s (labels %v)", n, labels)
		case !slices.Equal(got, labels):
			t.Errorf("docs/monitoring.md: %s has labels %v, the code %v", n, got, labels)
		}
	}
	for n := range doc {
		if _, ok := code[n]; !ok {
			t.Errorf("docs/monitoring.md lists %s, which nothing registers", n)
		}
	}
}
