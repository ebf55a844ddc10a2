//go:build !sidecaronly

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/webhook"
)

// The real webhook process with certificate rotation, run as its service
// account with a token of its own and only the rights the chart gives it
// (its Secret and its configuration by name, the caBundle only): it makes
// its CA and certificate, stores them in the chart's Secret, writes the CA
// into its webhook configuration, and the apiserver then sends it pods to
// inject. When its CA is gone (emptied here, as a CA past its end is
// replaced), it makes a new one, writes it into the Secret and the
// configuration, and pods are injected again with the new certificate.
func TestWebhookProcessRotatesItsCertificateWithTheChartsRights(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	ns, podNs := env.Namespace(t), env.Namespace(t)
	release := "handoff-" + ns // the chart's full name: it contains "handoff"
	sa, secretName := release+"-webhook", release+"-webhook-cert"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()

	objs := renderChart(t, release, ns, "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml",
		"--show-only", "templates/certificate.yaml", "--show-only", "templates/mutatingwebhookconfiguration.yaml",
		"--show-only", "templates/webhook-config-policy.yaml",
		"--set", "webhook.failurePolicy=Fail", "--set-json", `webhook.namespaceSelector={"matchLabels":{"kubernetes.io/metadata.name":"`+podNs+`"}}`)
	for _, obj := range objs {
		if obj.GetKind() != "MutatingWebhookConfiguration" {
			continue
		}
		// The apiserver here cannot reach a Service: the admin points the
		// configuration at the process, before the webhook runs.
		hooks, _, _ := unstructured.NestedSlice(obj.Object, "webhooks")
		for i := range hooks {
			_ = unstructured.SetNestedMap(hooks[i].(map[string]any), map[string]any{"url": fmt.Sprintf("https://localhost:%d%s", port, webhook.Path)}, "clientConfig")
		}
		_ = unstructured.SetNestedSlice(obj.Object, hooks, "webhooks")
	}
	createAll(t, env, objs)
	kubeconfig := serviceAccountKubeconfig(t, env, ns, sa, authorizationv1.ResourceAttributes{Namespace: ns, Verb: "list", Resource: "secrets", Name: secretName})

	certDir := t.TempDir()
	cmd, exited := runMain(t, fmt.Sprintf("webhook --kubeconfig %s --port %d --cert-dir %s --namespace %s --cert-secret %s --webhook-config %s --service %s --cert-dns-names localhost --metrics-addr 0 --health-addr 127.0.0.1:0 --image handoff:test",
		kubeconfig, port, certDir, ns, secretName, release, sa))

	// rotated waits until the configuration's caBundle is the Secret's
	// ca.crt and not before, puts the Secret's files where the kubelet
	// would (the server reads them there), and returns the CA.
	rotated := func(before []byte) []byte {
		var ca []byte
		kubetest.WaitFor(t, 60*time.Second, "the rotator to write a new CA into its Secret and its configuration", func() bool {
			select {
			case err := <-exited:
				t.Fatalf("the webhook exited: %v", err)
			default:
			}
			c, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, release, metav1.GetOptions{})
			if err != nil {
				return false
			}
			s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
			if err != nil || len(s.Data["tls.crt"]) == 0 {
				return false
			}
			ca = c.Webhooks[0].ClientConfig.CABundle
			if len(ca) == 0 || bytes.Equal(ca, before) || !bytes.Equal(ca, s.Data["ca.crt"]) {
				return false
			}
			for name, data := range s.Data {
				if err := os.WriteFile(filepath.Join(certDir, name), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			return true
		})
		return ca
	}
	injected := func(what string) {
		var pod *corev1.Pod
		kubetest.WaitFor(t, 60*time.Second, what, func() bool {
			pod, err = env.Client.CoreV1().Pods(podNs).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "worker-", Labels: map[string]string{"handoff.dev/inject": "true"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "worker:1"}}},
			}, metav1.CreateOptions{})
			return err == nil // refused (failurePolicy Fail) until the server is up with a certificate of the CA
		})
		if len(pod.Spec.InitContainers) != 2 || pod.Spec.InitContainers[1].Image != "handoff:test" {
			t.Errorf("pod init containers %v: want handoff-install and the handoff sidecar from handoff:test", pod.Spec.InitContainers)
		}
	}

	first := rotated(nil)
	injected("a pod to be created through the webhook")

	s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data = nil
	if _, err := env.Client.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rotated(first)
	injected("a pod to be created through the webhook with the new CA")

	terminate(t, cmd, exited, "webhook")
}
