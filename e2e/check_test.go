//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// checkRun is `handoff check -o json` as the tests read it.
type checkRun struct {
	Success    bool `json:"success"`
	Categories []struct {
		Checks []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Detail string `json:"detail"`
		} `json:"checks"`
	} `json:"categories"`
}

// status is the status of check id ("" if it did not run).
func (c checkRun) status(id string) string {
	for _, cat := range c.Categories {
		for _, ch := range cat.Checks {
			if ch.ID == id {
				return ch.Status
			}
		}
	}
	return ""
}

// handoffCheck runs `handoff check -n namespace -o json` on the cluster.
func handoffCheck(t *testing.T) (checkRun, string) {
	t.Helper()
	return handoffCheckIn(t, namespace)
}

// handoffCheckIn runs `handoff check -n ns -o json` on the cluster.
func handoffCheckIn(t *testing.T, ns string) (checkRun, string) {
	t.Helper()
	out, _ := exec.Command(mustCLI(t), "check", "--kubeconfig", cluster.kubeconfig, "-n", ns, "-o", "json").Output()
	var r checkRun
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("handoff check -o json: %v\n%s", err, out)
	}
	return r, string(out)
}

// On the cluster as the chart installed it: handoff check passes, the
// webhook reached through its Service (its EndpointSlices, and a dry-run
// pod injected by the API server's call); with the webhook's Deployment
// scaled to 0, the checks of its endpoints and of injection fail, and pass
// again once it is back.
func TestCheckOnTheCluster(t *testing.T) {
	ctx := context.Background()
	r, raw := handoffCheck(t)
	if !r.Success || r.status("webhook-endpoints") != "ok" || r.status("webhook-injects") != "ok" || r.status("kubernetes-version") != "ok" {
		t.Fatalf("handoff check on the healthy install:\n%s", raw)
	}
	text, _ := exec.Command(mustCLI(t), "check", "--kubeconfig", cluster.kubeconfig, "-n", namespace).CombinedOutput()
	t.Logf("$ handoff check -n %s\n%s", namespace, text)

	scale := func(n int) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
		if _, err := cluster.kube.AppsV1().Deployments("handoff").Patch(ctx, "handoff-webhook", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	scale(0)
	restored := false
	t.Cleanup(func() {
		if !restored {
			scale(2)
		}
	})
	// The webhook's pods keep serving for webhook.shutdownDelaySeconds
	// after their endpoints stop being ready: the dry run fails after.
	deadline := time.Now().Add(2 * time.Minute)
	for r, raw = handoffCheck(t); r.status("webhook-injects") != "failed" && time.Now().Before(deadline); r, raw = handoffCheck(t) {
		time.Sleep(time.Second)
	}
	if r.Success || r.status("webhook-endpoints") != "failed" || r.status("webhook-injects") != "failed" {
		t.Errorf("handoff check with the webhook scaled to 0: want webhook-endpoints and webhook-injects failed\n%s", raw)
	}

	scale(2)
	restored = true
	deadline = time.Now().Add(2 * time.Minute)
	for r, raw = handoffCheck(t); !r.Success && time.Now().Before(deadline); r, raw = handoffCheck(t) {
		time.Sleep(time.Second)
	}
	if !r.Success {
		t.Errorf("handoff check with the webhook back: \n%s", raw)
	}
}

// mustCLI is handoffCLI's path, or the test fails.
func mustCLI(t *testing.T) string {
	t.Helper()
	bin, err := handoffCLI()
	if err != nil {
		t.Fatalf("go build ./cmd/handoff: %v", err)
	}
	return bin
}
