package deploy_test

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/webhook"
)

// notInjected is what the chart's require-injection policy answers a pod
// that asked for the sidecar and was not injected.
const notInjected = "the handoff webhook did not inject pod"

var (
	vapResource     = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}
	vapbResource    = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"}
	webhookResource = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingwebhookconfigurations"}
)

// installRequireInjection creates what helm template renders of the
// chart's MutatingWebhookConfiguration and require-injection policy with
// set (failurePolicy Ignore, the default), the webhook's clientConfig
// replaced by clientConfig when it is not nil. It returns the func that
// deletes them and waits until a labelled pod with the marks of injection
// alone, in a labelled namespace (which every selectBy selects), is
// admitted again, so that no later test meets them. It returns once the
// policy refuses that pod.
func installRequireInjection(t *testing.T, clientConfig map[string]any, set ...string) func() {
	t.Helper()
	env := kubetest.Get(t)
	probe := env.Namespace(t)
	ns, err := env.Client.CoreV1().Namespaces().Get(context.Background(), probe, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels[inject.LabelInject] = "true"
	if _, err := env.Client.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	args := []string{"template", "handoff", "../charts/handoff", "--namespace", "handoff", "--kube-version", charttest.KubeVersion,
		"--show-only", "templates/mutatingwebhookconfiguration.yaml", "--show-only", "templates/require-injection-policy.yaml",
		"--set", "webhook.timeoutSeconds=2"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	objs := charttest.Decode(t, helm(t, args...))
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
		if o.GetKind() == "MutatingWebhookConfiguration" {
			hooks, _, err := unstructured.NestedSlice(o.Object, "webhooks")
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range hooks {
				if got := h.(map[string]any)["failurePolicy"]; got != "Ignore" {
					t.Fatalf("the chart's webhook failurePolicy is %v; this test is of Ignore, the default", got)
				}
				if clientConfig != nil {
					h.(map[string]any)["clientConfig"] = clientConfig
				}
			}
			if err := unstructured.SetNestedSlice(o.Object, hooks, "webhooks"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if kinds["ValidatingAdmissionPolicy"] != 1 || kinds["ValidatingAdmissionPolicyBinding"] != 1 || kinds["MutatingWebhookConfiguration"] != 1 {
		t.Fatalf("rendered %v; want a MutatingWebhookConfiguration, a ValidatingAdmissionPolicy and its binding", kinds)
	}
	dyn := dynamic.NewForConfigOrDie(env.Config)
	charttest.Create(t, env.Config, objs)
	// A labelled pod with the marks of injection and no sidecar: the
	// webhook leaves it alone (already injected), the policy refuses it.
	marked := func() *corev1.Pod {
		return labelledPod("marked", inject.AnnotationStatus, inject.StatusInjected, "label:"+inject.LabelInjected, "true")
	}
	// The API server takes policies up asynchronously.
	kubetest.WaitFor(t, 15*time.Second, "the require-injection policy to take effect", func() bool {
		return refusedUninjected(createPod(t, probe, marked()))
	})
	return func() {
		t.Helper()
		ctx := context.Background()
		for _, o := range objs {
			r := map[string]schema.GroupVersionResource{"ValidatingAdmissionPolicy": vapResource,
				"ValidatingAdmissionPolicyBinding": vapbResource, "MutatingWebhookConfiguration": webhookResource}[o.GetKind()]
			if err := dyn.Resource(r).Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
		kubetest.WaitFor(t, 15*time.Second, "the require-injection policy to be gone", func() bool {
			return createPod(t, probe, marked()) == nil
		})
	}
}

var injectSeq atomic.Int64

// labelledPod is a plain worker pod with the label handoff.dev/inject
// "true"; labels and annotations are added to it, pairs of key and value.
func labelledPod(prefix string, kv ...string) *corev1.Pod {
	p := plainPod(prefix, kv...)
	p.Labels[inject.LabelInject] = "true"
	return p
}

func plainPod(prefix string, kv ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, injectSeq.Add(1)),
		Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "worker:1"}}}}
	for i := 0; i+1 < len(kv); i += 2 {
		if strings.HasPrefix(kv[i], "label:") {
			p.Labels[strings.TrimPrefix(kv[i], "label:")] = kv[i+1]
		} else {
			p.Annotations[kv[i]] = kv[i+1]
		}
	}
	return p
}

func createPod(t *testing.T, ns string, p *corev1.Pod) error {
	t.Helper()
	_, err := kubetest.Get(t).Client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	return err
}

// refusedUninjected reports whether err is the require-injection policy's
// refusal, which names the cause and what to run.
func refusedUninjected(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), notInjected) &&
		strings.Contains(err.Error(), "is the webhook running? Run handoff check")
}

// TestUninjectedPodsThatAskAreRefused: with the webhook's failurePolicy
// Ignore (the default) and no webhook behind its Service, the API server
// admits every pod without calling it; the chart's require-injection
// ValidatingAdmissionPolicy then refuses, for each webhook.selectBy, exactly
// the pods the webhook would have been sent (selectionTable, as
// TestWebhookIsSentOnlySelectedPods), with a message that names the cause and `handoff
// check`; every other pod is created as it is.
func TestUninjectedPodsThatAskAreRefused(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	plain, labelled := env.Namespace(t), env.Namespace(t)
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
			nsOf := func(p selectionPod) string {
				if p.labelledNamespace {
					return labelled
				}
				return plain
			}
			mk := func(p selectionPod) *corev1.Pod {
				o := plainPod("p")
				if p.label != "" {
					o.Labels[inject.LabelInject] = p.label
				}
				if p.annotation != "" {
					o.Annotations[inject.AnnotationInject] = p.annotation
				}
				return o
			}
			cleanup := installRequireInjection(t, nil, "webhook.selectBy="+tc.selectBy)
			defer cleanup()
			kubetest.WaitFor(t, 15*time.Second, "the require-injection policy to take effect", func() bool {
				return refusedUninjected(createPod(t, nsOf(tc.pods[0]), mk(tc.pods[0])))
			})
			for _, p := range tc.pods {
				o := mk(p)
				err := createPod(t, nsOf(p), o)
				switch {
				case p.asks && !refusedUninjected(err):
					t.Errorf("pod in namespace labelled %v, label %q, annotation %q: %v; want refused: %s",
						p.labelledNamespace, p.label, p.annotation, err, notInjected)
				case p.asks && !strings.Contains(err.Error(), `missing: annotation handoff.dev/status: injected, label handoff.dev/injected: "true", init container handoff-install, sidecar container handoff`):
					t.Errorf("the refusal does not name what is missing: %v", err)
				case p.asks && !strings.Contains(err.Error(), "pod "+o.Name+","):
					t.Errorf("the refusal does not name pod %s: %v", o.Name, err)
				case !p.asks && err != nil:
					t.Errorf("pod in namespace labelled %v, label %q, annotation %q: %v; want created",
						p.labelledNamespace, p.label, p.annotation, err)
				}
			}
		})
	}
}

// TestRequireInjectionWithTheRealWebhook runs the webhook's handler
// (webhook.Injector) behind the chart's MutatingWebhookConfiguration
// (failurePolicy Ignore) and its require-injection policy, with a real
// kube-controller-manager's ReplicaSet controller. While the webhook is
// up, a labelled pod is injected and admitted (mutating webhooks run
// before validating admission policies). While it is down (every
// connection reset), a labelled pod is refused naming the cause, a plain
// pod is created, a pod carrying only the marks of injection (annotation
// and label, no sidecar) is refused, and a ReplicaSet records FailedCreate
// with the policy's message; once the webhook is back, the ReplicaSet's
// own retries create its pod, injected.
func TestRequireInjectionWithTheRealWebhook(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)

	injector := webhook.NewInjector(inject.Options{Image: "handoff:test", ImagePullPolicy: corev1.PullNever, Version: "v0.0.0-test"},
		prometheus.NewRegistry(), logr.Discard())
	handler := &admission.Webhook{Handler: injector}
	var down atomic.Bool
	var calls atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc(webhook.Path, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if down.Load() {
			panic(http.ErrAbortHandler) // the connection is reset: as a webhook that is gone
		}
		handler.ServeHTTP(w, r)
	})
	srv := httptest.NewTLSServer(mux)
	defer srv.Close()
	caBundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	cleanup := installRequireInjection(t, map[string]any{
		"url": srv.URL + webhook.Path, "caBundle": base64.StdEncoding.EncodeToString(caBundle)})
	defer cleanup()

	isInjected := func(p *corev1.Pod) bool {
		return p.Annotations[inject.AnnotationStatus] == inject.StatusInjected &&
			slices.ContainsFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.SidecarName }) &&
			slices.ContainsFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.InstallName })
	}
	t.Run("the webhook up: a labelled pod is injected and admitted", func(t *testing.T) {
		var got *corev1.Pod
		kubetest.WaitFor(t, 15*time.Second, "the webhook configuration to take effect", func() bool {
			p, err := env.Client.CoreV1().Pods(ns).Create(ctx, labelledPod("up"), metav1.CreateOptions{})
			got = p
			return err == nil && isInjected(p)
		})
		if got.Labels[inject.LabelInjected] != "true" {
			t.Errorf("injected pod %s has labels %v; want %s: \"true\"", got.Name, got.Labels, inject.LabelInjected)
		}
	})

	down.Store(true)
	t.Run("the webhook down: a labelled pod is refused, a plain pod created", func(t *testing.T) {
		before := calls.Load()
		err := createPod(t, ns, labelledPod("down"))
		if !refusedUninjected(err) {
			t.Errorf("labelled pod: %v; want refused: %s", err, notInjected)
		}
		if calls.Load() == before {
			t.Error("the API server did not call the webhook: this test is of a webhook that fails, not of one left out")
		}
		if err := createPod(t, ns, plainPod("plain")); err != nil {
			t.Errorf("plain pod: %v; want created", err)
		}
		// The marks alone, without what injection adds: refused as well.
		err = createPod(t, ns, labelledPod("forged", inject.AnnotationStatus, inject.StatusInjected, "label:"+inject.LabelInjected, "true"))
		if !refusedUninjected(err) || !strings.Contains(err.Error(), "missing: init container handoff-install, sidecar container handoff") {
			t.Errorf("a labelled pod with the marks of injection but no sidecar: %v; want refused, missing the containers", err)
		}
	})

	t.Run("a ReplicaSet retries until the webhook is back", func(t *testing.T) {
		stopKCM, err := env.StartControllerManager("replicaset")
		if err != nil {
			t.Fatal(err)
		}
		defer stopKCM()
		labels := map[string]string{"app": "orders", inject.LabelInject: "true"}
		rs, err := env.Client.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: "orders"},
			Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "orders"}},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: plainPod("t").Spec}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		kubetest.WaitFor(t, 60*time.Second, "the ReplicaSet's FailedCreate naming the cause", func() bool {
			evs, err := env.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(rs.UID)})
			return err == nil && slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
				return e.Reason == "FailedCreate" && strings.Contains(e.Message, notInjected) && strings.Contains(e.Message, "Run handoff check")
			})
		})
		if pods, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=orders"}); err != nil || len(pods.Items) != 0 {
			t.Fatalf("pods of the ReplicaSet while the webhook is down: %v, %v; want none", pods, err)
		}
		down.Store(false)
		var pods []corev1.Pod
		kubetest.WaitFor(t, 60*time.Second, "the ReplicaSet's pod once the webhook is back", func() bool {
			list, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=orders"})
			if err != nil {
				return false
			}
			pods = list.Items
			return len(pods) == 1
		})
		if !isInjected(&pods[0]) {
			t.Errorf("the ReplicaSet's pod %s is not injected: init containers %v", pods[0].Name, pods[0].Spec.InitContainers)
		}
	})
}
