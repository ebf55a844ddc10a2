package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/cli/clitest"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

func TestMain(m *testing.M) {
	// The test binary runs as handoff itself, with these arguments.
	if args := os.Getenv("HANDOFF_TEST_RUN_MAIN"); args != "" {
		os.Args = append([]string{"handoff"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	if os.Getenv(probeServerEnv) != "" {
		serveProbesUncapped()
		os.Exit(0)
	}
	kubetest.Run(m)
}

// The real sidecar process: it takes the Lease. SIGTERM in a pod that stays
// (a restart of the sidecar container alone) exits 0 and keeps the Lease,
// which the next sidecar process, with the same holder identity, renews
// without a new transition. SIGTERM with no preStop hook in a pod being
// deleted runs the sequence, releases the Lease, records the Event, and
// exits 0.
func TestSidecarProcessReleasesOnSIGTERM(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	pod := env.Pod(t, ns, "worker-0", 30)
	identity := "worker-0_" + string(pod.UID)
	token := clitest.TokenFile(t)
	sidecar := func() (*exec.Cmd, <-chan error) {
		return runMain(t, "sidecar", "HANDOFF_TOKEN_FILE="+token,
			"HANDOFF_POD_NAME=worker-0", "HANDOFF_POD_NAMESPACE="+ns, "HANDOFF_POD_UID="+string(pod.UID),
			"HANDOFF_LEASES=work", "HANDOFF_KUBECONFIG="+env.Kubeconfig,
			"HANDOFF_CONTROL_ADDR=127.0.0.1:0", "HANDOFF_METRICS_ADDR=127.0.0.1:0",
			"HANDOFF_APP_URL=http://127.0.0.1:1", // no app: nothing to drain
			"HANDOFF_LEASE_DURATION=3s", "HANDOFF_RENEW_DEADLINE=2s", "HANDOFF_RETRY_PERIOD=250ms")
	}
	get := func() *coordinationv1.Lease {
		l, err := env.Client.CoordinationV1().Leases(ns).Get(context.Background(), "work", metav1.GetOptions{})
		if err != nil {
			return &coordinationv1.Lease{}
		}
		return l
	}
	holder := func() string { return ptr.Deref(get().Spec.HolderIdentity, "") }

	cmd, exited := sidecar()
	kubetest.WaitFor(t, 20*time.Second, "the sidecar to take the Lease", func() bool { return holder() == identity })
	terminate(t, cmd, exited, "sidecar in a pod that stays")
	kept := get()
	if h := ptr.Deref(kept.Spec.HolderIdentity, ""); h != identity {
		t.Fatalf("Lease holder after SIGTERM in a pod that stays = %q, want %q (kept for the next sidecar)", h, identity)
	}

	cmd, exited = sidecar()
	kubetest.WaitFor(t, 10*time.Second, "the next sidecar process to renew the Lease", func() bool {
		l := get()
		return ptr.Deref(l.Spec.HolderIdentity, "") == identity && l.Spec.RenewTime.After(kept.Spec.RenewTime.Time)
	})
	if got, want := ptr.Deref(get().Spec.LeaseTransitions, 0), ptr.Deref(kept.Spec.LeaseTransitions, 0); got != want {
		t.Errorf("leaseTransitions %d after the sidecar restart, want %d: the same holder renews", got, want)
	}

	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), "worker-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	terminate(t, cmd, exited, "sidecar in a pod being deleted")
	if h := holder(); h != "" {
		t.Errorf("Lease holder after exit = %q, want released (empty)", h)
	}
	for _, reason := range []string{"SidecarRestart", "LeaseReleased"} {
		events, err := env.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.name=worker-0,reason=" + reason})
		if err != nil {
			t.Fatal(err)
		}
		if len(events.Items) != 1 {
			t.Errorf("%s Events on the pod = %d, want 1", reason, len(events.Items))
		}
	}
}

// terminate sends SIGTERM to cmd and fails the test unless it exits with
// status 0 within 20 s; exited receives cmd.Wait's result.
func terminate(t *testing.T, cmd *exec.Cmd, exited <-chan error, what string) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("%s exited with %v after SIGTERM, want 0", what, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not exit after SIGTERM", what)
	}
}

// runMain starts the test binary as handoff with args (space-separated) and
// the extra environment env; exited receives its Wait result. The process
// is killed at the end of the test if it still runs.
func runMain(t *testing.T, args string, env ...string) (*exec.Cmd, <-chan error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "HANDOFF_TEST_RUN_MAIN="+args), env...)
	return cmd, startProcess(t, cmd)
}

// startProcess starts cmd, its stderr ours, and returns the channel that
// receives its Wait result; it is killed at the end of the test if it
// still runs.
func startProcess(t *testing.T, cmd *exec.Cmd) <-chan error {
	t.Helper()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return exited
}
