package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
)

func TestMain(m *testing.M) {
	// The test binary runs as handoff itself, with these arguments.
	if args := os.Getenv("HANDOFF_TEST_RUN_MAIN"); args != "" {
		os.Args = append([]string{"handoff"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	kubetest.Main(m)
}

// The real sidecar process: it takes the Lease, and SIGTERM with no preStop
// hook runs the sequence, releases the Lease, records the Event, and exits 0.
func TestSidecarProcessReleasesOnSIGTERM(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	pod := env.Pod(t, ns, "worker-0", 30)
	identity := "worker-0_" + string(pod.UID)

	cmd, exited := runMain(t, "sidecar",
		"HANDOFF_POD_NAME=worker-0", "HANDOFF_POD_NAMESPACE="+ns, "HANDOFF_POD_UID="+string(pod.UID),
		"HANDOFF_LEASES=work", "HANDOFF_KUBECONFIG="+env.Kubeconfig,
		"HANDOFF_CONTROL_ADDR=127.0.0.1:0", "HANDOFF_METRICS_ADDR=127.0.0.1:0",
		"HANDOFF_APP_URL=http://127.0.0.1:1", // no app: nothing to drain
		"HANDOFF_LEASE_DURATION=3s", "HANDOFF_RENEW_DEADLINE=2s", "HANDOFF_RETRY_PERIOD=250ms")

	holder := func() string {
		l, err := env.Client.CoordinationV1().Leases(ns).Get(context.Background(), "work", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	for deadline := time.Now().Add(20 * time.Second); holder() != identity; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the sidecar did not take the Lease; holder %q", holder())
		}
	}

	terminate(t, cmd, exited, "sidecar")
	if h := holder(); h != "" {
		t.Errorf("Lease holder after exit = %q, want released (empty)", h)
	}
	events, err := env.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=worker-0,reason=LeaseReleased"})
	if err != nil {
		t.Fatal(err)
	}
	if len(events.Items) != 1 {
		t.Errorf("LeaseReleased Events on the pod = %d, want 1", len(events.Items))
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
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, exited
}
