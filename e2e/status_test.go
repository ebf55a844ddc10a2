//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// handoffCLI builds bin/handoff (the CLI, as a user runs it) once for the
// run and returns its path.
var handoffCLI = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "handoff-e2e-cli-")
	if err != nil {
		return "", err
	}
	cliDir.Store(&dir)
	bin := filepath.Join(dir, "handoff")
	// As ko builds the image's (.ko.yaml), so that the packages compiled
	// for the release are reused.
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/handoff")
	cmd.Dir, cmd.Stderr, cmd.Env = "..", os.Stderr, append(os.Environ(), "CGO_ENABLED=0")
	return bin, cmd.Run()
})

// cliDir is the directory handoffCLI built the CLI in, removed at the end
// of the run (run); nil until it is built.
var cliDir atomic.Pointer[string]

// statusView is the part of `handoff status -o json` the tests read.
type statusView struct {
	Leases []struct {
		Name      string `json:"name"`
		State     string `json:"state"`
		HolderPod string `json:"holderPod"`
	} `json:"leases"`
	Pods []statusPod `json:"pods"`
}

// statusPod is a pod of statusView.
type statusPod struct {
	Name         string `json:"name"`
	Phase        string `json:"phase"`
	PhaseFrom    string `json:"phaseFrom"`
	LastHandover *struct {
		Outcome string `json:"outcome"`
	} `json:"lastHandover"`
}

// statusWatch runs `handoff status --watch -o json` on app's pods until
// stop, which returns every view it printed, and the text view (`handoff
// status`) taken when a view first showed a pod ShuttingDown.
func statusWatch(t *testing.T, app string) (stop func() ([]statusView, string)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, mustCLI(t), "status", "--kubeconfig", cluster.kubeconfig, "-n", namespace, "-l", "app="+app, "--watch", "-o", "json")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var views []statusView
	var draining string
	read := make(chan struct{})
	go func() {
		defer close(read)
		lines := bufio.NewScanner(out)
		lines.Buffer(nil, 4<<20)
		for lines.Scan() {
			var v statusView
			if err := json.Unmarshal(lines.Bytes(), &v); err != nil {
				t.Errorf("handoff status --watch -o json printed a line that is not a view: %v\n%s", err, lines.Text())
				continue
			}
			views = append(views, v)
			if draining == "" && slices.ContainsFunc(v.Pods, func(p statusPod) bool { return p.Phase == "ShuttingDown" }) {
				draining = statusText(t, app)
			}
		}
	}()
	return func() ([]statusView, string) {
		cancel()
		<-read
		_ = cmd.Wait()
		return views, draining
	}
}

// assertStatusSawTheHandover checks the views of a rollout of app: the
// Lease held by one of the old pods, then by a new pod; an old pod seen
// with a handover under way or done (from its Events).
func assertStatusSawTheHandover(t *testing.T, views []statusView, lease string, old []string) {
	t.Helper()
	heldByOld, movedAfter, drainSeen := false, false, false
	// The phases the old pods' sidecars wrote on their pods, in the order
	// seen.
	var written []string
	for _, v := range views {
		for _, l := range v.Leases {
			if l.Name != lease || l.State != "Held" {
				continue
			}
			if slices.Contains(old, l.HolderPod) {
				heldByOld = true
			} else if heldByOld && l.HolderPod != "" {
				movedAfter = true
			}
		}
		for _, p := range v.Pods {
			if slices.Contains(old, p.Name) && p.LastHandover != nil && (p.Phase == "ShuttingDown" || p.Phase == "Done") {
				drainSeen = true
			}
			if slices.Contains(old, p.Name) && p.PhaseFrom == "sidecar" && !slices.Contains(written, p.Phase) {
				written = append(written, p.Phase)
			}
		}
	}
	if !heldByOld || !movedAfter || !drainSeen {
		t.Errorf("handoff status --watch, %d views: Lease %s held by an old pod %t, then by a new pod %t; an old pod's handover seen %t; want all",
			len(views), lease, heldByOld, movedAfter, drainSeen)
	}
	// The sidecars wrote their phases on their pods, and status read them:
	// Running before the rollout, ShuttingDown (or, if a view came late,
	// Done) after its start.
	if !slices.Contains(written, "Running") || (!slices.Contains(written, "ShuttingDown") && !slices.Contains(written, "Done")) {
		t.Errorf("handoff status --watch: the old pods' phases as their sidecars wrote them: %v; want Running, then ShuttingDown or Done", written)
	}
}

// statusText returns `handoff status` of app's pods, as an operator reads
// it.
func statusText(t *testing.T, app string) string {
	bin, err := handoffCLI()
	if err != nil {
		return err.Error()
	}
	out, err := exec.Command(bin, "status", "--kubeconfig", cluster.kubeconfig, "-n", namespace, "-l", "app="+app).CombinedOutput()
	if err != nil {
		t.Errorf("handoff status: %v\n%s", err, out)
	}
	return fmt.Sprintf("$ handoff status -n %s -l app=%s\n%s", namespace, app, out)
}
