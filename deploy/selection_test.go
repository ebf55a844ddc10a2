package deploy_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// TestWebhookIsSentOnlySelectedPods installs the chart's
// MutatingWebhookConfiguration, as helm template renders it for each
// webhook.selectBy, on a real apiserver, with failurePolicy Fail and no
// webhook behind its Service: a pod the apiserver sends to the webhook is
// refused ("failed calling webhook"), one it does not send is created. So
// the pods that do not ask for handoff never wait on the webhook, and a pod
// with only the annotation is not seen under selectBy pod.
func TestWebhookIsSentOnlySelectedPods(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	plain := env.Namespace(t)
	labelled := env.Namespace(t)
	ns, err := env.Client.CoreV1().Namespaces().Get(ctx, labelled, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["handoff.dev/inject"] = "true"
	if _, err := env.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range selectionTable {
		t.Run(tc.selectBy, func(t *testing.T) {
			rendered := helm(t, "template", "handoff", "../charts/handoff", "--namespace", "handoff", "--kube-version", "1.35.0",
				"--show-only", "templates/mutatingwebhookconfiguration.yaml",
				"--set", "webhook.selectBy="+tc.selectBy, "--set", "webhook.failurePolicy=Fail", "--set", "webhook.timeoutSeconds=1")
			objs := charttest.Decode(t, rendered)
			if len(objs) != 1 || objs[0].GetKind() != "MutatingWebhookConfiguration" {
				t.Fatalf("rendered %d objects; want one MutatingWebhookConfiguration", len(objs))
			}
			res := dynamic.NewForConfigOrDie(env.Config).Resource(schema.GroupVersionResource{
				Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingwebhookconfigurations"})
			if _, err := res.Create(ctx, objs[0], metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			nsOf := func(p selectionPod) string {
				if p.labelledNamespace {
					return labelled
				}
				return plain
			}
			probe := tc.pods[0]
			// The apiserver picks up webhook configurations asynchronously:
			// wait until it sends the first pod, and, after the delete,
			// until it no longer does.
			kubetest.WaitFor(t, 10*time.Second, "the webhook configuration to take effect", func() bool {
				return sentToWebhook(t, nsOf(probe), probe.label, probe.annotation)
			})
			defer func() {
				if err := res.Delete(ctx, objs[0].GetName(), metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				kubetest.WaitFor(t, 10*time.Second, "the webhook configuration to be gone", func() bool {
					return !sentToWebhook(t, nsOf(probe), probe.label, probe.annotation)
				})
			}()
			for _, p := range tc.pods {
				if got := sentToWebhook(t, nsOf(p), p.label, p.annotation); got != p.sent {
					t.Errorf("pod in namespace labelled %v, label %q, annotation %q: sent to the webhook %v; want %v",
						p.labelledNamespace, p.label, p.annotation, got, p.sent)
				}
			}
		})
	}
}

// selectionPod is a pod of selectionTable: in a namespace labelled
// handoff.dev/inject=true or not, with the label and annotation
// handoff.dev/inject given ("" for none); whether its webhook.selectBy
// has the API server send it to the webhook (TestWebhookIsSentOnlySelectedPods),
// and whether it asks for injection: sent, and its own label or annotation
// "true", which is what the webhook injects (inject.wanted). The
// require-injection policy refuses exactly the pods that ask and were not
// injected (TestUninjectedPodsThatAskAreRefused), and none while the
// webhook is up (TestRequireInjectionRefusesNothingWhileTheWebhookIsUp): a
// pod of a labelled namespace that does not ask itself is sent, so that
// its annotations are read, and created as it is.
type selectionPod struct {
	labelledNamespace bool
	label, annotation string
	sent, asks        bool
}

// selectionTable is the pods of each webhook.selectBy; its first pod is
// sent and asks.
var selectionTable = []struct {
	selectBy string
	pods     []selectionPod
}{
	{"pod", []selectionPod{
		{label: "true", sent: true, asks: true},
		{labelledNamespace: true, label: "true", sent: true, asks: true},
		{},
		{annotation: "true"}, // the trade-off: not seen
		{label: "false"},
		{labelledNamespace: true},
	}},
	{"namespace", []selectionPod{
		{labelledNamespace: true, annotation: "true", sent: true, asks: true},
		{labelledNamespace: true, label: "true", sent: true, asks: true},
		{labelledNamespace: true, sent: true}, // seen, so its annotations are read; it does not ask
		{labelledNamespace: true, annotation: "false", sent: true},
		{labelledNamespace: true, label: "false"},
		{label: "true"},
		{},
	}},
	{"podOrNamespace", []selectionPod{
		{label: "true", sent: true, asks: true},
		{labelledNamespace: true, annotation: "true", sent: true, asks: true},
		{labelledNamespace: true, label: "true", sent: true, asks: true},
		{labelledNamespace: true, sent: true},
		{labelledNamespace: true, label: "false"},
		{},
		{annotation: "true"},
	}},
}

var podSeq atomic.Int64

// sentToWebhook creates a pod in ns with the label and annotation
// handoff.dev/inject given ("" for none) and reports whether the apiserver
// sent it to the webhook, which nothing serves: it is then refused.
func sentToWebhook(t *testing.T, ns, label, annotation string) bool {
	t.Helper()
	meta := metav1.ObjectMeta{Name: fmt.Sprintf("p%d", podSeq.Add(1)), Labels: map[string]string{}, Annotations: map[string]string{}}
	if label != "" {
		meta.Labels["handoff.dev/inject"] = label
	}
	if annotation != "" {
		meta.Annotations["handoff.dev/inject"] = annotation
	}
	_, err := kubetest.Get(t).Client.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: meta, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "worker"}}},
	}, metav1.CreateOptions{})
	switch {
	case err == nil:
		return false
	case apierrors.IsInternalError(err) && strings.Contains(err.Error(), "failed calling webhook"):
		return true
	default:
		t.Fatalf("create pod %s/%s: %v", ns, meta.Name, err)
		return false
	}
}
