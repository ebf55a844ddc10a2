//go:build !sidecaronly

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/webhook"
)

// webhookFloodConns is the flood TestWebhookProcessRotatesItsCertificateAndInjects
// opens on the webhook's port from one address: 2,000 connections (each a
// goroutine and a TLS connection in the webhook process, which runs with
// the race detector here).
const webhookFloodConns = 2000

// The real webhook process with certificate rotation: it makes its CA and
// certificate, stores them in its Secret, writes the CA into its webhook
// configuration, and the apiserver then sends it pods to inject. A flood
// of connections from another address takes none of the slots the
// apiserver needs.
func TestWebhookProcessRotatesItsCertificateAndInjects(t *testing.T) {
	env := kubetest.Get(t)
	ctx := context.Background()
	ns, podNs := env.Namespace(t), env.Namespace(t)
	if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "handoff-webhook-cert"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cfgName := "handoff-" + ns
	_, err = env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: cfgName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         "inject.handoff.dev",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://localhost:%d%s", port, webhook.Path))},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			// Only this test's pods.
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": podNs}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, cfgName, metav1.DeleteOptions{})
	})

	certDir := t.TempDir()
	cmd, exited := runMain(t, fmt.Sprintf("webhook --kubeconfig %s --port %d --cert-dir %s --namespace %s --webhook-config %s --cert-dns-names localhost --metrics-addr 0 --health-addr 127.0.0.1:0 --image handoff:test",
		env.Kubeconfig, port, certDir, ns, cfgName))

	kubetest.WaitFor(t, 30*time.Second, "the rotator to write the CA into the webhook configuration", func() bool {
		c, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, cfgName, metav1.GetOptions{})
		return err == nil && len(c.Webhooks[0].ClientConfig.CABundle) > 0
	})
	secret, err := env.Client.CoreV1().Secrets(ns).Get(ctx, "handoff-webhook-cert", metav1.GetOptions{})
	if err != nil || len(secret.Data["tls.crt"]) == 0 || len(secret.Data["ca.crt"]) == 0 {
		t.Fatalf("certificate Secret %v, %v: want tls.crt and ca.crt", secret.Data, err)
	}
	// What the kubelet does for the chart's Secret volume: the rotator
	// starts the server once the files it stored are in --cert-dir.
	for name, data := range secret.Data {
		if err := os.WriteFile(filepath.Join(certDir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	var pod *corev1.Pod
	kubetest.WaitFor(t, 30*time.Second, "a pod to be created through the webhook", func() bool {
		pod, err = env.Client.CoreV1().Pods(podNs).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "worker-", Annotations: map[string]string{"handoff.dev/inject": "true"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "worker:1"}}},
		}, metav1.CreateOptions{})
		return err == nil // refused (failurePolicy Fail) until the server is up
	})
	if len(pod.Spec.InitContainers) != 2 || pod.Spec.InitContainers[1].Image != "handoff:test" {
		t.Errorf("pod init containers %v: want handoff-install and the handoff sidecar from handoff:test", pod.Spec.InitContainers)
	}

	// A flood from another pod (127.0.0.2): the webhook keeps at most
	// webhookTimeouts.conns.PerAddr of its connections and resets the
	// rest, and the apiserver's calls are still served.
	f := openFlood(t, "127.0.0.2", fmt.Sprintf("127.0.0.1:%d", port), webhookFloodConns)
	t.Cleanup(f.close)
	if open := f.open(); open > webhookTimeouts.conns.PerAddr {
		t.Errorf("the webhook holds %d of %d connections from one address; want at most %d", open, len(f.conns), webhookTimeouts.conns.PerAddr)
	}
	if _, err := env.Client.CoreV1().Pods(podNs).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "worker-", Annotations: map[string]string{"handoff.dev/inject": "true"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "worker:1"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Errorf("a pod created during the flood: %v; want it admitted", err)
	}
	f.close()

	terminate(t, cmd, exited, "webhook")
}
