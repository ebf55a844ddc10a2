package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/internal/cli/clitest"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/leadtrace"
)

// One sidecar process holding 100 Leases at the default timings, with no
// other traffic, keeps every one: each Lease's renewals come within the
// renew deadline over four renew deadlines, the app never sees a lapse of
// leadership, and no LeaseLost Event is recorded. (With the Lease client's
// old fixed budget of 20 requests/s, 100 Leases renewed every 2 s need 50:
// renewals queued in the token bucket past the renew deadline.)
func TestSidecarHolds100LeasesAtDefaultTimings(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute on a real apiserver")
	}
	const n = 100
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	pod := env.Pod(t, ns, "worker-0", 30)
	defaults := defaultTimings(t)

	trace := leadtrace.New()
	tokenPath, _, agent := clitest.TokenAgent(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: trace.Wrap(agent.Handler()), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	renewals := leadtrace.WatchRenewals(ctx, env.Client, ns)
	defer func() { cancel(); <-renewals.Done() }()

	leases := make([]string, n)
	for i := range leases {
		leases[i] = fmt.Sprintf("part-%03d", i)
	}
	cmd, exited := runMain(t, "sidecar", "HANDOFF_TOKEN_FILE="+tokenPath,
		"HANDOFF_POD_NAME=worker-0", "HANDOFF_POD_NAMESPACE="+ns, "HANDOFF_POD_UID="+string(pod.UID),
		"HANDOFF_LEASES="+strings.Join(leases, ","), "HANDOFF_KUBECONFIG="+env.Kubeconfig,
		"HANDOFF_CONTROL_ADDR=127.0.0.1:0", "HANDOFF_METRICS_ADDR=127.0.0.1:0",
		"HANDOFF_APP_URL=http://"+ln.Addr().String())
	// Lease timings are the defaults: the process reads no HANDOFF_ timing
	// variable from this test.

	// Acquiring 100 free Leases takes a few requests each; a lease duration
	// is ample.
	acquire := defaults.LeaseDuration
	deadline := time.Now().Add(acquire)
	for trace.Summary().Leading < n {
		if time.Now().After(deadline) {
			t.Fatalf("the app led %d of %d Leases %s after the sidecar started, want all: %+v", trace.Summary().Leading, n, acquire, trace.Summary())
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := trace.Summary()
	renewals.Reset()

	window := 4 * defaults.RenewDeadline
	time.Sleep(window)

	after := trace.Summary()
	if lapses := after.Lapses - before.Lapses; lapses != 0 || after.Leading != n {
		t.Errorf("over %s: %d app-visible lapses of leadership (%s in all), %d of %d Leases led at the end; want 0 lapses, all led",
			window, lapses, after.Lapsed-before.Lapsed, after.Leading, n)
	}
	gaps, writes := renewals.Gaps(time.Now())
	var late []string
	for _, name := range leases {
		if g, ok := gaps[name]; !ok || g > defaults.RenewDeadline {
			late = append(late, fmt.Sprintf("%s %s", name, g.Round(time.Millisecond)))
		}
	}
	if len(late) > 0 {
		t.Errorf("over %s, %d of %d Leases went longer than the renew deadline %s between renewals (%d renewals seen in all): %s",
			window, len(late), n, defaults.RenewDeadline, writes, strings.Join(late[:min(len(late), 10)], ", "))
	}
	var longest time.Duration
	for _, g := range gaps {
		longest = max(longest, g)
	}
	t.Logf("over %s: %d renewals of %d Leases, longest gap %s; app: %d grants, %d lapses",
		window, writes, n, longest.Round(time.Millisecond), after.Grants-before.Grants, after.Lapses-before.Lapses)

	events, err := env.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=worker-0,reason=LeaseLost"})
	if err != nil {
		t.Fatal(err)
	}
	if len(events.Items) != 0 {
		t.Errorf("%d LeaseLost Events on the pod, want 0", len(events.Items))
	}
	terminate(t, cmd, exited, "sidecar holding 100 Leases")
}

// defaultTimings are the Lease timings of a sidecar given none.
func defaultTimings(t *testing.T) *config.Settings {
	t.Helper()
	s, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
