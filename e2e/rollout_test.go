//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
)

const leaseName = "pgworker-leader"

// worker is the example worker's Deployment, injected by the webhook with
// the given handoff annotations besides inject and leases.
func worker(name string, replicas int32, grace int64, annotations ...string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	ann := map[string]string{"handoff.dev/inject": "true", "handoff.dev/leases": leaseName}
	for i := 0; i+1 < len(annotations); i += 2 {
		ann[annotations[i]] = annotations[i+1]
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: ann},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To(grace),
					Containers: []corev1.Container{{
						Name: "worker", Image: "handoff.local/pgworker:e2e", ImagePullPolicy: corev1.PullNever,
						Args: []string{"--database-url", cluster.podDBURL, "--lease", leaseName, "--visibility-timeout", "20s"},
					}},
				},
			},
		},
	}
}

// holderLog polls the Lease's holder every 20 ms and keeps each change.
type holderLog struct {
	mu      sync.Mutex
	changes []holderChange
}

type holderChange struct {
	at     time.Time
	holder string
}

func (h *holderLog) watch(ctx context.Context) {
	last := "\x00"
	for ctx.Err() == nil {
		l, err := cluster.kube.CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
		if err == nil {
			holder := ptr.Deref(l.Spec.HolderIdentity, "")
			if holder != last {
				h.mu.Lock()
				h.changes = append(h.changes, holderChange{time.Now(), holder})
				h.mu.Unlock()
				last = holder
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deploy creates d, waits until it has rolled out, and deletes it (and
// waits for its pods to go) at the end of the test.
func deploy(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	ctx := context.Background()
	if _, err := cluster.kube.AppsV1().Deployments(namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.kube.AppsV1().Deployments(namespace).Delete(ctx, d.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			pods, err := cluster.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + d.Name})
			if err == nil && len(pods.Items) == 0 {
				return
			}
		}
		t.Errorf("the pods of %s did not go within a minute", d.Name)
	})
	waitRollout(t, d.Name, 2*time.Minute)
}

func waitRollout(t *testing.T, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		d, err := cluster.kube.AppsV1().Deployments(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == *d.Spec.Replicas &&
			d.Status.AvailableReplicas == *d.Spec.Replicas && d.Status.Replicas == *d.Spec.Replicas {
			pods, err := cluster.kube.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + name})
			if err == nil && len(pods.Items) == int(*d.Spec.Replicas) {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("deployment %s did not finish rolling out within %s", name, timeout)
}

// TestRolloutRestartHandsOver restarts the workers under a steady load:
// every message is processed once, and the Lease goes from each leaving
// holder to a successor within the bound, without lapsing to nobody for
// long.
func TestRolloutRestartHandsOver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deploy(t, worker("orders", 3, 20))

	// A steady load: 20 messages a second, each 100-600 ms of work.
	var load sync.WaitGroup
	loadCtx, stopLoad := context.WithCancel(ctx)
	load.Go(func() {
		for i := 0; loadCtx.Err() == nil; i++ {
			msgs := []queue.Message{{DedupKey: fmt.Sprintf("m-%d", i), Amount: int64(i%7 + 1), WorkMillis: 100 + (i*37)%500}}
			if err := queue.Enqueue(loadCtx, cluster.pool, msgs); err != nil && loadCtx.Err() == nil {
				t.Errorf("enqueue: %v", err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	holders := &holderLog{}
	go holders.watch(ctx)
	time.Sleep(3 * time.Second)

	restart := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := cluster.kube.AppsV1().Deployments(namespace).Patch(ctx, "orders", types.StrategicMergePatchType, []byte(restart), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, "orders", 3*time.Minute)
	time.Sleep(3 * time.Second)
	stopLoad()
	load.Wait()

	// Every message processed, none applied twice.
	var rep queue.Report
	deadline := time.Now().Add(time.Minute)
	for {
		var err error
		if rep, err = queue.Check(ctx, cluster.pool); err != nil {
			t.Fatal(err)
		}
		if rep.Pending == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("queue: %s", rep)
	if err := rep.Err(); err != nil {
		t.Error(err)
	}
	if rep.Pending != 0 {
		t.Errorf("%d messages still pending a minute after the load stopped", rep.Pending)
	}

	holders.mu.Lock()
	defer holders.mu.Unlock()
	var gaps []string
	for i, c := range holders.changes {
		t.Logf("%s holder %q", c.at.Format("15:04:05.000"), c.holder)
		if c.holder == "" && i+1 < len(holders.changes) {
			gap := holders.changes[i+1].at.Sub(c.at)
			gaps = append(gaps, gap.String())
			// The standby's retry period is 2 s: handoff must do better.
			if gap > 2*time.Second {
				t.Errorf("the Lease was free for %s before %q took it", gap, holders.changes[i+1].holder)
			}
		}
	}
	if len(holders.changes) < 2 {
		t.Errorf("the Lease never changed holder during the rollout")
	}
	old := holders.changes[0].holder
	if last := holders.changes[len(holders.changes)-1].holder; last == "" || strings.HasPrefix(last, strings.SplitN(old, "_", 2)[0]) {
		t.Errorf("after the rollout the Lease is held by %q; want a new pod", last)
	}
	t.Logf("free gaps observed: %v", gaps)
}
