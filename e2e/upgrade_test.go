//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/handoff-dev/handoff/inject"
)

// nextVersion is the release the upgrade test moves to from releaseVersion.
const nextVersion = "v0.0.1-e2e"

// TestUpgradeWithPodsRunning upgrades the installed release (releaseVersion)
// to the next one (the same tree built and pushed as nextVersion by
// hack/release.sh: its images and its chart, from the same registry) with
// helm upgrade, as a user does, while a labelled workload runs under load
// and pods are submitted for admission all along (server-side dry runs,
// every 100 ms). It checks that
//   - every pod submitted during the upgrade was admitted with the sidecar:
//     none refused, none without it (the webhook's replicas hand over
//     without a gap);
//   - the webhook's pods end at the next version, and new pods carry it
//     (handoff.dev/version, annotation and label) and run its sidecar image;
//   - the pods injected before the upgrade keep their sidecar and still hand
//     over: the Lease holder among them, deleted after the upgrade, passes
//     the Lease to a live pod within the retry period of its release;
//   - after a rollout restart no pod of the workload carries another version
//     (the selector docs give: handoff.dev/injected,handoff.dev/version!=…);
//   - nothing was lost or applied twice, and the leader runs never overlap.
//
// The previous version here is this tree under another version: the test
// proves the upgrade's mechanics and that a release's objects (RBAC,
// policies, webhook configuration) accept pods injected by the release
// before. Both sides of a real skew are pods of one version each (a pod's
// sidecar, hook and install step come from one image), which is why the
// supported skew is stated per pod in docs/upgrading.md.
func TestUpgradeWithPodsRunning(t *testing.T) {
	ctx := context.Background()
	next, err := buildRelease((*exec.Cmd).Output, images.release.registry, t.TempDir(), nextVersion)
	if err != nil {
		t.Fatal(err)
	}

	const name = "upgrade"
	lease := name + "-leader"
	d := withFaults(worker(name, 2, 10), false)
	deploy(t, d)
	rec := record(t, name, lease)
	l := startLoad(t, name, 5, shortWork)
	waitWorkersStarted(t, name)
	before := podsOf(t, name)
	for _, p := range before {
		if v := p.Labels[inject.LabelVersion]; v != releaseVersion {
			t.Fatalf("pod %s injected at version %q, want %s", p.Name, v, releaseVersion)
		}
	}
	if h := waitHeld(rec, 30*time.Second); h == "" {
		t.Fatalf("Lease %s not held within 30s", lease)
	}

	// Pods submitted for admission while the release is upgraded: the
	// workload's pod template, dry run (nothing is created).
	probes := startAdmissionProbes(t, d.Spec.Template)
	args := []string{"upgrade", "handoff", next.record["CHART"], "--version", next.record["CHART_VERSION"],
		"--namespace", "handoff", "--reset-then-reuse-values", "--wait", "--timeout", "3m"}
	args = append(args, next.imageValues()...)
	if plainHTTP(next.registry) {
		args = append(args, "--plain-http")
	}
	upgradeStart := time.Now()
	if out, err := runTool("helm", args...); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	t.Logf("helm upgrade to %s: %s", nextVersion, time.Since(upgradeStart).Round(100*time.Millisecond))
	// The upgrade is over when the webhook's pods are all the next
	// version's and none of the old ones is left; then two more seconds of
	// probes, which must all be injected by the next version.
	done := waitWebhookAt(t, nextVersion, next.handoff, 2*time.Minute)
	t.Logf("webhook pods all at %s, the old ones gone: %s after helm upgrade began", nextVersion, done.Sub(upgradeStart).Round(100*time.Millisecond))
	time.Sleep(2 * time.Second)
	got := probes.stop()
	t.Logf("admission during the upgrade: %s", got)
	if got.total() == 0 {
		t.Fatal("no pod was submitted during the upgrade")
	}
	if got.refused > 0 || got.uninjected > 0 {
		t.Errorf("during the upgrade %d pods were refused and %d admitted without the sidecar, of %d; want every one injected (%s)",
			got.refused, got.uninjected, got.total(), got.firstError)
	}
	after := 0
	for _, a := range got.log {
		if a.at.After(done) {
			after++
			if a.version != nextVersion {
				t.Errorf("%s: a pod submitted after the upgrade was over was injected at %q, want %s", a.at.Format("15:04:05.000"), a.version, nextVersion)
			}
		}
	}
	if after == 0 {
		t.Error("no pod was submitted after the upgrade was over")
	}

	// The pods injected before the upgrade still run their own sidecar, and
	// the Lease holder among them hands over.
	for _, p := range podsOf(t, name) {
		if p.Labels[inject.LabelVersion] != releaseVersion {
			t.Errorf("pod %s, injected before the upgrade, now says version %q", p.Name, p.Labels[inject.LabelVersion])
		}
	}
	holder := podOf(waitHeld(rec, 30*time.Second))
	if holder == "" {
		t.Fatalf("Lease %s not held after the upgrade", lease)
	}
	since := time.Now()
	rec.deleting(holder)
	if err := deletePod(holder, nil); err != nil {
		t.Fatal(err)
	}
	waitGone(t, holder, since, 60*time.Second)
	successor := waitHeld(rec, 30*time.Second)
	if successor == "" || podOf(successor) == holder {
		t.Fatalf("Lease %s held by %q after its holder %s (injected at %s) was deleted; want another live pod", lease, successor, holder, releaseVersion)
	}
	rec.checkTerms(t, lease)
	waitRollout(t, name, 2*time.Minute)

	// New pods are the next version's, and after a rollout restart every pod is.
	restartDeployment(t, name)
	waitRollout(t, name, 3*time.Minute)
	old, err := cluster.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: fmt.Sprintf("app=%s,%s,%s!=%s", name, inject.LabelInjected, inject.LabelVersion, nextVersion)})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range old.Items {
		if p.DeletionTimestamp == nil {
			t.Errorf("pod %s still at version %q after the rollout restart", p.Name, p.Labels[inject.LabelVersion])
		}
	}
	for _, p := range podsOf(t, name) {
		if p.Annotations[inject.AnnotationVersion] != nextVersion || !runsImage(p, next.sidecar) {
			t.Errorf("pod %s after the restart: version %q, images %v; want %s and %s", p.Name, p.Annotations[inject.AnnotationVersion], podImages(p), nextVersion, next.sidecar)
		}
	}
	l.end()
	checkQueue(t, 90*time.Second)
	for _, c := range leaderChanges(t, lease, time.Time{}) {
		if c.back || c.token <= c.prevToken {
			t.Errorf("leader runs: %s after %s with fencing token %d after %d; want no overlap", c.holder, c.prev, c.token, c.prevToken)
		}
	}
}

// waitWebhookAt waits up to timeout until every pod of the webhook runs
// image and is labelled version, and no other pod of it is left
// (terminating included), and returns when; it fails the test at the
// deadline with what it saw.
func waitWebhookAt(t *testing.T, version, image string, timeout time.Duration) time.Time {
	t.Helper()
	var seen []string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		list, err := cluster.kube.CoreV1().Pods("handoff").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=webhook"})
		if err != nil {
			t.Fatal(err)
		}
		seen = seen[:0]
		ready := len(list.Items) > 0
		for _, p := range list.Items {
			seen = append(seen, fmt.Sprintf("%s %s %s deleting=%t", p.Name, p.Labels["app.kubernetes.io/version"], p.Spec.Containers[0].Image, p.DeletionTimestamp != nil))
			if p.DeletionTimestamp != nil || p.Labels["app.kubernetes.io/version"] != version || p.Spec.Containers[0].Image != image {
				ready = false
			}
		}
		if ready {
			return time.Now()
		}
	}
	t.Fatalf("the webhook's pods not all at %s (%s) within %s: %v", version, image, timeout, seen)
	return time.Time{}
}

// runTool runs one of hack/tools.sh's tools on the cluster under test.
func runTool(name string, args ...string) (string, error) {
	tools, err := exec.Command("bash", "../hack/tools.sh").Output()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(strings.TrimSpace(string(tools)), name), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.kubeconfig)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// admissionProbes submits a pod for admission every 100 ms until stopped.
type admissionProbes struct {
	stopCh chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	got    admissions
}

// admissions counts what admission made of the probes.
type admissions struct {
	injected, uninjected, refused int
	versions                      map[string]int // injected ones by handoff.dev/version
	firstError                    string
	log                           []admission // each, in time order
}

// admission is what became of one probe: the version that injected it, or
// "" (refused or not injected).
type admission struct {
	at      time.Time
	version string
}

func (a admissions) total() int { return a.injected + a.uninjected + a.refused }

func (a admissions) String() string {
	return fmt.Sprintf("%d submitted: %d injected %v, %d without the sidecar, %d refused", a.total(), a.injected, a.versions, a.uninjected, a.refused)
}

func startAdmissionProbes(t *testing.T, tmpl corev1.PodTemplateSpec) *admissionProbes {
	p := &admissionProbes{stopCh: make(chan struct{}), got: admissions{versions: map[string]int{}}}
	t.Cleanup(func() { p.stop() })
	p.wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.stopCh:
				return
			case <-tick.C:
			}
			pod := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
			pod.GenerateName = "upgrade-probe-"
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			got, err := cluster.kube.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			cancel()
			p.mu.Lock()
			a := admission{at: time.Now()}
			if err == nil {
				a.version = got.Annotations[inject.AnnotationVersion]
			}
			p.got.log = append(p.got.log, a)
			switch {
			case err != nil:
				p.got.refused++
				if p.got.firstError == "" {
					p.got.firstError = err.Error()
				}
			case got.Annotations[inject.AnnotationVersion] == "":
				p.got.uninjected++
			default:
				p.got.injected++
				p.got.versions[got.Annotations[inject.AnnotationVersion]]++
			}
			p.mu.Unlock()
		}
	})
	return p
}

// stop ends the probes (once) and returns their counts.
func (p *admissionProbes) stop() admissions {
	select {
	case <-p.stopCh:
	default:
		close(p.stopCh)
	}
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got
}

// podsOf lists the pods of app that are not terminating.
func podsOf(t *testing.T, app string) []corev1.Pod {
	t.Helper()
	list, err := cluster.kube.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			pods = append(pods, p)
		}
	}
	return pods
}

// restartDeployment does what kubectl rollout restart does: a new
// restartedAt annotation on the pod template.
func restartDeployment(t *testing.T, name string) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := cluster.kube.AppsV1().Deployments(namespace).Patch(context.Background(), name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func podImages(p corev1.Pod) []string {
	var out []string
	for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		out = append(out, c.Image)
	}
	return out
}

func runsImage(p corev1.Pod, image string) bool {
	for _, i := range podImages(p) {
		if i == image {
			return true
		}
	}
	return false
}
