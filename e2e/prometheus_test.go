//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/outcome"
	"github.com/handoff-dev/handoff/protocol"
)

// promPort is the e2e Prometheus's, on loopback, below Linux's ephemeral
// range as pgPort is.
const promPort = "25490"

// promInterval is the e2e Prometheus's scrape and evaluation interval:
// short by default (1 s), so that a test waits seconds, not minutes, for a
// sample or an alert. HANDOFF_E2E_SCRAPE_INTERVAL (a duration from 1s to
// 60s) sets another, for figures that must hold at an operator's interval
// (e2e/rollout-figures.sh 30s: a pod with nothing to drain is gone as fast
// at 30 s as at 1 s, since no sidecar waits for a scrape).
var promInterval = scrapeInterval()

// scrapeInterval is $HANDOFF_E2E_SCRAPE_INTERVAL, or 1 s when unset; the
// suite stops at start on a value that is not a duration from 1s to 60s.
func scrapeInterval() time.Duration {
	s := os.Getenv("HANDOFF_E2E_SCRAPE_INTERVAL")
	if s == "" {
		return time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second || d > time.Minute {
		fmt.Fprintf(os.Stderr, "e2e: HANDOFF_E2E_SCRAPE_INTERVAL=%q: want a duration from 1s to 60s, like 30s\n", s)
		os.Exit(2)
	}
	return d
}

// prom is the e2e Prometheus's base URL; empty when none runs (a cluster
// given by HANDOFF_E2E_KUBECONFIG, whose pods this machine may not reach).
var prom string

// promConfig is the e2e Prometheus's configuration: the pods' sidecars
// found and labelled as the chart's PodMonitor has the Prometheus Operator
// do it (the label handoff.dev/injected, the port handoff-metrics; the
// labels namespace, pod, container, and the PodMonitor's pod_uid and
// workload, its relabelings copied); the webhook's pods as its
// ServiceMonitor has it (the port metrics, HTTPS with a token bound to
// <release>-webhook-metrics-reader, honour_labels so that the handover
// series keep the namespace of the pods they count); and the chart's alert
// rules as files/alerts.yaml has them (the PrometheusRule the chart renders
// is that file: TestPrometheusRuleIsTheTestedRuleFile).
const promConfig = `global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
rule_files: [%[2]q]
scrape_configs:
  - job_name: handoff-sidecars
    kubernetes_sd_configs:
      - role: pod
        kubeconfig_file: %[3]q
        namespaces: {names: [%[4]q]}
    relabel_configs:
      - {source_labels: [__meta_kubernetes_pod_label_handoff_dev_injected], regex: "true", action: keep}
      - {source_labels: [__meta_kubernetes_pod_container_port_name], regex: handoff-metrics, action: keep}
      - {source_labels: [__meta_kubernetes_pod_phase], regex: (Failed|Succeeded), action: drop}
      - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}
      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
      - {source_labels: [__meta_kubernetes_pod_container_name], target_label: container}
      - {source_labels: [__meta_kubernetes_pod_uid], target_label: pod_uid}
      - {source_labels: [__meta_kubernetes_pod_name], target_label: workload}
      - {source_labels: [__meta_kubernetes_pod_controller_kind, __meta_kubernetes_pod_controller_name], separator: ";", regex: "[^;]+;(.+)", target_label: workload}
      - {source_labels: [__meta_kubernetes_pod_controller_kind, __meta_kubernetes_pod_controller_name, __meta_kubernetes_pod_label_pod_template_hash], separator: ";", regex: "ReplicaSet;(.+)-[a-z0-9]+;.+", target_label: workload}
  - job_name: handoff-webhook
    scheme: https
    honor_labels: true
    tls_config: {insecure_skip_verify: true}
    authorization: {credentials_file: %[5]q}
    kubernetes_sd_configs:
      - role: pod
        kubeconfig_file: %[3]q
        namespaces: {names: [%[6]q]}
    relabel_configs:
      - {source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_component], regex: webhook, action: keep}
      - {source_labels: [__meta_kubernetes_pod_container_port_name], regex: metrics, action: keep}
      - {source_labels: [__meta_kubernetes_pod_phase], regex: (Failed|Succeeded), action: drop}
      - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}
      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
`

// platformNamespace and platformRelease are where the e2e installs the
// chart (the quickstart's helm install handoff … --namespace handoff).
const platformNamespace, platformRelease = "handoff", "handoff"

// scraperToken makes the service account e2e-prometheus in the platform's
// namespace, binds it to the chart's <release>-webhook-metrics-reader
// ClusterRole, as docs/monitoring.md asks of a Prometheus, and writes a
// token of it into file, for the webhook's scrape.
func scraperToken(file string) error {
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "e2e-prometheus"}}
	if _, err := cluster.kube.CoreV1().ServiceAccounts(platformNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-prometheus"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: platformRelease + "-webhook-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: platformNamespace}},
	}
	if _, err := cluster.kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	tok, err := cluster.kube.CoreV1().ServiceAccounts(platformNamespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(12 * 3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("a token for the e2e Prometheus: %w", err)
	}
	return os.WriteFile(file, []byte(tok.Status.Token), 0o600)
}

// startPrometheus starts a real Prometheus (hack/tools.sh builds it from
// the Go module proxy) that scrapes the e2e namespace's sidecars and
// evaluates the chart's alert rules, on our own cluster only. It is killed
// with this process (Pdeathsig) should the cleanups not run.
func (s *setup) startPrometheus() error {
	if os.Getenv("HANDOFF_E2E_KUBECONFIG") != "" {
		fmt.Fprintln(os.Stderr, "e2e: no Prometheus on a cluster given by HANDOFF_E2E_KUBECONFIG (its pods may not be reachable from here): the alert checks are skipped")
		return nil
	}
	tools, err := s.sh(nil, "bash", "hack/tools.sh")
	if err != nil {
		return err
	}
	dir := filepath.Join(s.dir, "prometheus")
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return err
	}
	rules := filepath.Join(s.root, "charts", "handoff", "files", "alerts.yaml")
	token := filepath.Join(dir, "webhook-token")
	if err := scraperToken(token); err != nil {
		return err
	}
	config := fmt.Sprintf(promConfig, promInterval, rules, s.kubeconfig, namespace, token, platformNamespace)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(tools, "prometheus"), "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:"+promPort, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("prometheus: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logFile.Close(); close(exited) }()
	s.c.add(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	base := "http://127.0.0.1:" + promPort
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(base + "/-/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				prom = base
				fmt.Fprintf(os.Stderr, "e2e: Prometheus at %s, scraping the sidecars of namespace %s and the webhook every %s (log: %s)\n", base, namespace, promInterval, logFile.Name())
				return nil
			}
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logFile.Name())
			return fmt.Errorf("prometheus exited at start:\n%s", log)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("prometheus not ready within 60s at %s (log: %s)", base, logFile.Name())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// promSample is one series of an instant query's vector.
type promSample struct {
	Metric map[string]string
	Value  float64
}

// promQuery runs expr as an instant query now and returns its vector; a
// query Prometheus refuses fails t.
func promQuery(t *testing.T, expr string) []promSample {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, prom+"/api/v1/query?"+url.Values{"query": {expr}}.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("Prometheus query %s: %v", expr, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("Prometheus query %s: %s: %v", expr, resp.Status, err)
	}
	if body.Status != "success" {
		t.Fatalf("Prometheus query %s: %s", expr, body.Error)
	}
	if body.Data.ResultType != "vector" {
		t.Fatalf("Prometheus query %s: a %s, want a vector", expr, body.Data.ResultType)
	}
	out := make([]promSample, 0, len(body.Data.Result))
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("Prometheus query %s: value %v: %v", expr, r.Value[1], err)
		}
		out = append(out, promSample{Metric: r.Metric, Value: v})
	}
	return out
}

// promValue is the value of expr's one series, or ok false when it has none.
func promValue(t *testing.T, expr string) (v float64, ok bool) {
	t.Helper()
	r := promQuery(t, expr)
	switch len(r) {
	case 0:
		return 0, false
	case 1:
		return r[0].Value, true
	}
	t.Fatalf("Prometheus query %s: %d series, want one", expr, len(r))
	return 0, false
}

// firingAlerts is the set of alerts firing now, or at any evaluation of
// the last window if window is above 0, in the e2e namespace, each as its
// name and labels.
func firingAlerts(t *testing.T, window time.Duration) map[string]bool {
	t.Helper()
	expr := fmt.Sprintf(`ALERTS{alertstate="firing",namespace=%q}`, namespace)
	if window > 0 {
		expr = fmt.Sprintf("max_over_time(%s[%dms])", expr, window.Milliseconds())
	}
	out := map[string]bool{}
	for _, s := range promQuery(t, expr) {
		var labels []string
		for k, v := range s.Metric {
			if k != "alertname" && k != "alertstate" && k != "__name__" {
				labels = append(labels, k+"="+v)
			}
		}
		sort.Strings(labels)
		out[s.Metric["alertname"]+"{"+strings.Join(labels, ",")+"}"] = true
	}
	return out
}

// alertsBefore is what a rollout's check compares with: the alerts
// firing when it began, and when; the webhook's counts of the namespace's
// handovers and drain deadlines then; and the ShutdownFinished Events
// then, by UID, with their counts.
type alertsBefore struct {
	at                   time.Time
	firing               map[string]bool
	handovers, deadlines float64
	summaries            map[types.UID]int32
}

// promBefore records the alerts firing now and the webhook's counts,
// before a rollout; nil without a Prometheus. It first waits (up to 10 s)
// until the namespace's last ShutdownFinished Event is old enough to be
// counted and scraped (a pod of an earlier test, still leaving), so that
// the counts and the Events it records agree.
func promBefore(t *testing.T) *alertsBefore {
	t.Helper()
	if prom == "" {
		return nil
	}
	settle := 3 * promInterval
	deadline := time.Now().Add(10 * time.Second)
	for {
		newest := time.Time{}
		for _, e := range summaryEvents(t) {
			newest = maxTime(newest, eventLast(e))
		}
		if time.Since(newest) > settle || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Until(newest.Add(settle)))
	}
	b := &alertsBefore{at: time.Now(), firing: firingAlerts(t, 0), handovers: promHandovers(t), deadlines: promDeadlines(t), summaries: map[types.UID]int32{}}
	for _, e := range summaryEvents(t) {
		b.summaries[e.UID] = max(e.Count, 1)
	}
	return b
}

// promHandovers is the webhook's count of the e2e namespace's handovers
// (handoff_handovers_total summed over outcomes and replicas), 0 before
// any.
func promHandovers(t *testing.T) float64 {
	t.Helper()
	if prom == "" {
		return 0
	}
	v, _ := promValue(t, fmt.Sprintf(`sum(handoff_handovers_total{namespace=%q})`, namespace))
	return v
}

// promDeadlines is the webhook's count of the e2e namespace's drains that
// reached their deadline (handoff_handover_step_seconds_count with step
// drain-deadline), 0 before any.
func promDeadlines(t *testing.T) float64 {
	t.Helper()
	if prom == "" {
		return 0
	}
	v, _ := promValue(t, fmt.Sprintf(`sum(handoff_handover_step_seconds_count{namespace=%q,step="drain-deadline"})`, namespace))
	return v
}

// summaryEvents are the ShutdownFinished Events of the e2e namespace.
func summaryEvents(t *testing.T) []corev1.Event {
	t.Helper()
	list, err := cluster.kube.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "source=handoff,reason=" + outcome.Reason})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func eventLast(e corev1.Event) time.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// checkRolloutSeen checks, on the e2e Prometheus, a rollout that began at
// before.at and replaced the pods old (gone by now):
//
//   - each old pod wrote one ShutdownFinished Event with a summary, which
//     has a drain-deadline step exactly when the pod's Events say its
//     drain reached its deadline (DrainDeadlineExceeded);
//   - the webhook counted every ShutdownFinished occurrence written since
//     before.at, the old pods' and any other pod's of the namespace, once:
//     handoff_handovers_total summed over outcomes grew by exactly their
//     number, and the drain-deadline steps by exactly the number of them
//     whose summary has one (the sidecars did not stay for a scrape);
//   - no alert began firing since, but HandoffDrainDeadlineExceeded, and
//     that one only if a pod reached its deadline.
//
// It returns the names of the old pods that reached their deadline.
func checkRolloutSeen(t *testing.T, before *alertsBefore, old []string) []string {
	t.Helper()
	if before == nil {
		t.Log("no Prometheus (a cluster given by HANDOFF_E2E_KUBECONFIG): the alert checks are skipped")
		return nil
	}
	window := time.Since(before.at) + 10*time.Second
	var deadline []string
	for _, pod := range old {
		es, _ := podEvents(t, pod)
		hit := slices.ContainsFunc(es, func(e corev1.Event) bool { return e.Reason == "DrainDeadlineExceeded" })
		if hit {
			deadline = append(deadline, pod)
		}
		var sums []outcome.Summary
		for _, e := range es {
			if e.Reason != outcome.Reason {
				continue
			}
			s, err := outcome.Decode(e.Annotations[outcome.Annotation])
			if err != nil {
				t.Errorf("pod %s: its %s Event %s: %v", pod, outcome.Reason, e.Name, err)
				continue
			}
			sums = append(sums, s)
		}
		if len(sums) != 1 {
			t.Errorf("pod %s: %d %s summaries, want 1", pod, len(sums), outcome.Reason)
			continue
		}
		if _, reached := sums[0].Steps[protocol.StepDrainDeadline]; reached != hit {
			t.Errorf("pod %s: its summary's drain-deadline step %v, its DrainDeadlineExceeded Event %v", pod, reached, hit)
		}
	}
	// Every occurrence since before.at, by the Events, read again at each
	// try: a pod of the namespace may still be leaving.
	since := func() (handovers, deadlines float64) {
		for _, e := range summaryEvents(t) {
			n := max(e.Count, 1) - before.summaries[e.UID]
			if n <= 0 {
				continue
			}
			handovers += float64(n)
			if s, err := outcome.Decode(e.Annotations[outcome.Annotation]); err == nil {
				if _, reached := s.Steps[protocol.StepDrainDeadline]; reached {
					deadlines += float64(n)
				}
			}
		}
		return handovers, deadlines
	}
	var handovers, deadlines, gotHandovers, gotDeadlines float64
	ok := false
	for end := time.Now().Add(10 * promInterval); !ok && time.Now().Before(end); {
		handovers, deadlines = since()
		gotHandovers, gotDeadlines = promHandovers(t)-before.handovers, promDeadlines(t)-before.deadlines
		if ok = gotHandovers == handovers && gotDeadlines == deadlines; !ok {
			time.Sleep(promInterval / 4) // the next scrape of the webhook
		}
	}
	if handovers < float64(len(old)) {
		t.Errorf("%v ShutdownFinished occurrences since the rollout began, want at least the %d replaced pods'", handovers, len(old))
	}
	if !ok {
		t.Errorf("the webhook's counts grew by %v handovers and %v drain deadlines; the namespace's ShutdownFinished Events since the rollout began say %v and %v", gotHandovers, gotDeadlines, handovers, deadlines)
	}
	var fired []string
	for a := range firingAlerts(t, window) {
		if !before.firing[a] {
			fired = append(fired, a)
		}
	}
	sort.Strings(fired)
	for _, a := range fired {
		if !strings.HasPrefix(a, "HandoffDrainDeadlineExceeded{") || deadlines == 0 {
			t.Errorf("alert %s began firing during the rollout (pods that reached their drain deadline: %v)", a, deadline)
		}
	}
	t.Logf("the webhook counted the %v handovers (the %d replaced pods' and others') and %v drain deadlines since the rollout began; old pods that reached their deadline: %v; alerts that began firing: %v", handovers, len(old), deadlines, deadline, fired)
	return deadline
}

// waitAlertFiring waits up to timeout for alert name to fire in the e2e
// namespace, and fails t if it does not.
func waitAlertFiring(t *testing.T, name string, timeout time.Duration) {
	t.Helper()
	kubetest.WaitFor(t, timeout, "alert "+name+" to fire", func() bool {
		for a := range firingAlerts(t, 0) {
			if strings.HasPrefix(a, name+"{") {
				return true
			}
		}
		return false
	})
}

// dashboardPanels is the chart's dashboard's panels: title and queries.
func dashboardPanels(t *testing.T) map[string][]string {
	t.Helper()
	_, d := charttest.DashboardFile(t)
	out := map[string][]string{}
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			out[p.Title] = append(out[p.Title], q.Expr)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// checkDashboard runs every query of the chart's dashboard on the e2e
// Prometheus, for the e2e namespace, as Grafana would: each must be
// accepted, and each must return data but those of metrics the e2e
// Prometheus does not scrape (the API server's) and the webhook's
// admissions (none in the last minute, after a rollout's pods are up).
func checkDashboard(t *testing.T) {
	t.Helper()
	if prom == "" {
		return
	}
	// Grafana's $__rate_interval is at least four scrape intervals (1m at
	// the 1 s default, as before; 2m at an operator's 30 s), so that a
	// rate has samples enough to compute.
	rate := fmt.Sprintf("%ds", int(max(time.Minute, 4*promInterval).Seconds()))
	vars := strings.NewReplacer("$namespace", namespace, "$cluster", ".*", "$workload", ".*", "$pod", ".*", "$lease", ".*", "$__rate_interval", rate)
	panels := dashboardPanels(t)
	if panels == nil {
		t.Fatal("the dashboard has no panel")
	}
	// Every query is run; one that returns nothing (but those of series
	// the e2e Prometheus does not scrape) is run again each half scrape
	// interval for four scrape intervals (at least 5 s) before it counts as
	// empty: a series the last rollout created may not have the samples a
	// rate needs yet at an operator's 30 s interval.
	type query struct{ title, q string }
	var pending []query
	for title, exprs := range panels {
		for _, e := range exprs {
			q := vars.Replace(e)
			got := promQuery(t, q)
			unscraped := strings.Contains(q, "handoff_webhook_admissions_total") || strings.Contains(q, "apiserver_")
			if len(got) == 0 && !unscraped {
				pending = append(pending, query{title, q})
			}
		}
	}
	for deadline := time.Now().Add(max(5*time.Second, 4*promInterval)); len(pending) > 0 && time.Now().Before(deadline); {
		time.Sleep(promInterval / 2)
		pending = slices.DeleteFunc(pending, func(q query) bool { return len(promQuery(t, q.q)) > 0 })
	}
	for _, q := range pending {
		t.Errorf("dashboard panel %q: %s returns nothing from the sidecars' metrics within %s", q.title, q.q, max(5*time.Second, 4*promInterval))
	}
	t.Logf("the dashboard's %d panels' queries ran on the e2e Prometheus", len(panels))
}
