package clitest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/kubetest"
)

// ServiceAccountToken returns a token of the service account ns/name from
// the TokenRequest API, valid for an hour.
func ServiceAccountToken(t testing.TB, env *kubetest.Env, ns, name string) string {
	t.Helper()
	tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// ServiceAccountKubeconfig writes a kubeconfig for the control plane that
// authenticates as the service account ns/name with a token of its own, so
// that a process run with it has that account's rights and no more; it
// waits until RBAC grants the account verb on resource (group/resource, in
// ns) named name.
func ServiceAccountKubeconfig(t testing.TB, env *kubetest.Env, ns, name string, check authorizationv1.ResourceAttributes) string {
	t.Helper()
	token := ServiceAccountToken(t, env, ns, name)
	cfg, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for k := range cfg.AuthInfos {
		cfg.AuthInfos[k] = &clientcmdapi.AuthInfo{Token: token}
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	as := kubernetes.NewForConfigOrDie(rc)
	kubetest.WaitFor(t, 10*time.Second, "RBAC to grant "+ns+"/"+name+" "+check.Verb+" "+check.Resource, func() bool {
		r, err := as.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &check}}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
	return path
}

// CreatePod creates a pod in ns with labels, annotations and image, and
// sets its phase when given.
func CreatePod(t testing.TB, env *kubetest.Env, ns, name, image string, labels, annotations map[string]string, phase corev1.PodPhase) {
	t.Helper()
	ctx := context.Background()
	pod, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "sidecar-or-not", Image: "other:1"}, {Name: "webhook", Image: image}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
	if phase != "" {
		pod.Status.Phase = phase
		if _, err := env.Client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}
