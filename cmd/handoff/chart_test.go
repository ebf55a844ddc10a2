//go:build !sidecaronly

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/handoff-dev/handoff/internal/kubetest"
)

// renderChart renders the handoff chart as release in namespace with helm
// template and the extra args (built by hack/tools.sh), and returns its
// objects. Outside CI (CI unset) the test is skipped when helm cannot be
// built.
func renderChart(t *testing.T, release, namespace string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := exec.Command("bash", "../../hack/tools.sh").Output()
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no helm to render the chart with: hack/tools.sh: %v; in CI (CI set) this test fails instead", err)
		}
		t.Fatalf("hack/tools.sh: %v", err)
	}
	cmd := exec.Command(filepath.Join(strings.TrimSpace(string(out)), "helm"), append([]string{"template", release, "../../charts/handoff",
		"--namespace", namespace, "--kube-version", "1.35.0"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stream, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.Bytes())
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			t.Fatal(err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}

// createAll creates objs as the admin; the cluster-scoped ones are deleted
// at the end of the test.
func createAll(t *testing.T, env *kubetest.Env, objs []*unstructured.Unstructured) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(env.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(env.Config)))
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk.Kind, obj.GetName(), err)
		}
		r := dyn.Resource(m.Resource)
		var ri dynamic.ResourceInterface = r
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = r.Namespace(obj.GetNamespace())
		} else {
			t.Cleanup(func() { _ = r.Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}) })
		}
		if _, err := ri.Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s %s: %v", gvk.Kind, obj.GetName(), err)
		}
	}
}

// serviceAccountToken returns a token of the service account ns/name from
// the TokenRequest API, valid for an hour.
func serviceAccountToken(t *testing.T, env *kubetest.Env, ns, name string) string {
	t.Helper()
	tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// serviceAccountKubeconfig writes a kubeconfig for the control plane that
// authenticates as the service account ns/name with a token of its own, so
// that a process run with it has that account's rights and no more; it
// waits until RBAC grants the account verb on resource (group/resource, in
// ns) named name.
func serviceAccountKubeconfig(t *testing.T, env *kubetest.Env, ns, name string, check authorizationv1.ResourceAttributes) string {
	t.Helper()
	token := serviceAccountToken(t, env, ns, name)
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
