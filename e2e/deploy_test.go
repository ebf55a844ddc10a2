//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/inject"
)

// worker is the example worker's Deployment, run as serviceAccount and
// labelled for the webhook to inject handoff for the Lease name-leader,
// whose leader runs the leader job; args are added to the worker's. The
// Lease must be one of workerLeases, the only ones the chart lets
// serviceAccount hold.
func worker(name string, replicas int32, grace int64, args ...string) *appsv1.Deployment {
	lease := name + "-leader"
	if !slices.Contains(workerLeases, lease) {
		panic(fmt.Sprintf("e2e: Lease %s is not in workerLeases (e2e_test.go): the chart's Role lets service account %s hold only those", lease, serviceAccount))
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      map[string]string{"app": name, inject.LabelInject: "true"},
					Annotations: map[string]string{"handoff.dev/leases": lease, "handoff.dev/role-leases": lease}, // the leader job: a role
				},
				Spec: corev1.PodSpec{
					ServiceAccountName:            serviceAccount,
					TerminationGracePeriodSeconds: ptr.To(grace),
					Containers: []corev1.Container{{
						Name: "worker", Image: images.pgworker, ImagePullPolicy: images.pullPolicy,
						Args: append([]string{"--database-url", cluster.podDBURL, "--lease", lease}, args...),
					}},
				},
			},
		},
	}
}

// annotate sets a pod template annotation of d.
func annotate(d *appsv1.Deployment, key, value string) *appsv1.Deployment {
	d.Spec.Template.Annotations[key] = value
	return d
}

// withoutHandoff turns d into the baseline: no handoff label or
// annotations, and the worker holding its Lease itself with client-go, as
// a worker without handoff does, as baselineServiceAccount (allowed the same
// Leases by a Role of the test's).
func withoutHandoff(d *appsv1.Deployment) *appsv1.Deployment {
	delete(d.Spec.Template.Labels, inject.LabelInject)
	d.Spec.Template.Spec.ServiceAccountName = baselineServiceAccount
	d.Spec.Template.Annotations = map[string]string{}
	c := &d.Spec.Template.Spec.Containers[0]
	c.Args = append(c.Args, "--without-handoff")
	return d
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
		if err := undeploy(ctx, d.Name); err != nil {
			t.Error(err)
		}
	})
	waitRollout(t, d.Name, 2*time.Minute)
}

// undeploy deletes Deployment name (a Deployment already gone is no error)
// and waits up to a minute for its pods to go.
func undeploy(ctx context.Context, name string) error {
	err := cluster.kube.AppsV1().Deployments(namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete deployment %s: %w", name, err)
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		pods, err := cluster.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err == nil && len(pods.Items) == 0 {
			return nil
		}
	}
	return fmt.Errorf("the pods of %s did not go within a minute", name)
}

// waitRollout waits until Deployment name has all its replicas updated and
// available, and no other pods.
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

// checkQueue waits up to timeout for the queue to be empty, then asserts
// that its history is sound (nothing lost or applied twice, no stale
// leader run) and nothing is left pending, and returns the check.
func checkQueue(t *testing.T, timeout time.Duration) queue.Report {
	t.Helper()
	var rep queue.Report
	for deadline := time.Now().Add(timeout); ; time.Sleep(500 * time.Millisecond) {
		var err error
		if rep, err = queue.Check(context.Background(), cluster.pool); err != nil {
			t.Fatal(err)
		}
		if rep.Pending == 0 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("queue: %s", rep)
	if err := rep.Err(); err != nil {
		t.Error(err)
	}
	if rep.Pending != 0 {
		t.Errorf("%d messages still pending after %s", rep.Pending, timeout)
	}
	return rep
}
