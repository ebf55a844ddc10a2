package deploy_test

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"net/http/httptest"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/webhook"
)

// TestRequireInjectionRefusesNothingWhileTheWebhookIsUp: the
// require-injection policy guards against a webhook outage, so with the
// real webhook (webhook.Injector) up, no pod of selectionTable is refused
// by it, under any webhook.selectBy: each is either injected or created as
// it is. Under selectBy namespace the API server sends the webhook every
// pod of a labelled namespace, and the webhook injects only those whose
// own label or annotation handoff.dev/inject is "true" (inject.wanted).
// The policy took every such pod for one that asks, and refused a plain
// pod of the namespace, or one annotated "false", with "is the webhook
// running?" while it ran (found on the e2e cluster by a breaking review):
// it now asks what the webhook asks.
func TestRequireInjectionRefusesNothingWhileTheWebhookIsUp(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	plain, labelled := env.Namespace(t), env.Namespace(t)
	ns, err := env.Client.CoreV1().Namespaces().Get(ctx, labelled, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels[inject.LabelInject] = "true"
	if _, err := env.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	injector := webhook.NewInjector(inject.Options{Image: "handoff:test", ImagePullPolicy: corev1.PullNever, Version: "v0.0.0-test"},
		prometheus.NewRegistry(), logr.Discard())
	srv := httptest.NewTLSServer(&admission.Webhook{Handler: injector})
	defer srv.Close()
	caBundle := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	for _, tc := range selectionTable {
		t.Run(tc.selectBy, func(t *testing.T) {
			cleanup := installRequireInjection(t, map[string]any{"url": srv.URL + webhook.Path, "caBundle": caBundle},
				"webhook.selectBy="+tc.selectBy)
			defer cleanup()
			for _, p := range tc.pods {
				o := plainPod("up")
				if p.label != "" {
					o.Labels[inject.LabelInject] = p.label
				}
				if p.annotation != "" {
					o.Annotations[inject.AnnotationInject] = p.annotation
				}
				in := plain
				if p.labelledNamespace {
					in = labelled
				}
				if err := createPod(t, in, o); refusedUninjected(err) {
					t.Errorf("the webhook up, pod in namespace labelled %v, label %q, annotation %q: refused by the require-injection policy: %v",
						p.labelledNamespace, p.label, p.annotation, err)
				}
			}
		})
	}
}
