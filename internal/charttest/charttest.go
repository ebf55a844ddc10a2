// Package charttest runs the pinned helm on the handoff chart and creates
// what it renders on a test's apiserver, for the tests of package deploy and
// of cmd/handoff.
//
// helm is the one hack/tools.sh builds and caches (with its helm-unittest
// plugin). Where it cannot be built, a test is skipped outside CI and fails
// in CI (the environment variable CI set), so that a developer without the
// tools still runs the rest.
package charttest

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

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// KubeVersion is the Kubernetes version the chart is rendered for: the
// oldest supported.
const KubeVersion = "1.35.0"

// Root is the repository's top directory: the nearest directory above the
// test's working directory with a go.mod.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("charttest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Chart is the chart's directory.
func Chart(t testing.TB) string { return filepath.Join(Root(t), "charts", "handoff") }

// Tool returns the path of the pinned tool name (helm, promtool, ...)
// that hack/tools.sh installs, installing it if missing. Without it the
// test is skipped, unless CI is set: then it fails. Under go test -short
// (make unit) hack/tools.sh is not run (it installs every tool, minutes
// cold): the tool already built is used, else the test is skipped.
func Tool(t testing.TB, name string) string {
	t.Helper()
	if testing.Short() {
		cache := os.Getenv("HANDOFF_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "handoff")
		}
		bin := filepath.Join(cache, "bin", name)
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("needs the pinned %s, not built yet (make tools builds it); skipped under -short", name)
		}
		return bin
	}
	out, err := exec.Command("bash", filepath.Join(Root(t), "hack", "tools.sh")).Output()
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no %s: hack/tools.sh: %v; in CI (CI set) this test fails instead", name, err)
		}
		t.Fatalf("hack/tools.sh: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), name)
}

// Helm runs the pinned helm with args (its plugins found) and returns its
// standard output; an error fails t, with helm's output.
func Helm(t testing.TB, args ...string) []byte {
	t.Helper()
	stdout, stderr, err := HelmResult(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
	}
	return stdout
}

// HelmResult runs the pinned helm with args and returns its standard
// output, its standard error and how it exited, for a test that expects
// it to fail.
func HelmResult(t testing.TB, args ...string) (stdout, stderr []byte, err error) {
	t.Helper()
	helm := Tool(t, "helm")
	cmd := exec.Command(helm, args...)
	cmd.Env = append(os.Environ(), "HELM_PLUGINS="+filepath.Join(filepath.Dir(helm), "helm-plugins"))
	var errb bytes.Buffer
	cmd.Stderr = &errb
	stdout, err = cmd.Output()
	return stdout, errb.Bytes(), err
}

// Render renders the chart as release in namespace for KubeVersion, with
// the extra args (--set, --show-only, ...), and returns its objects.
func Render(t testing.TB, release, namespace string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	return Decode(t, Helm(t, append([]string{"template", release, Chart(t), "--namespace", namespace, "--kube-version", KubeVersion}, args...)...))
}

// Decode parses a YAML stream into its objects, skipping empty documents.
func Decode(t testing.TB, stream []byte) []*unstructured.Unstructured {
	t.Helper()
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

// Create creates objs with cfg (the admin's), in order, and deletes the
// cluster-scoped ones when the test ends (the namespaced ones go with the
// test's namespace). It returns them by kind.
func Create(t testing.TB, cfg *rest.Config, objs []*unstructured.Unstructured) map[string][]*unstructured.Unstructured {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(cfg)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg)))
	byKind := map[string][]*unstructured.Unstructured{}
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
			t.Fatalf("create %s %s/%s: %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
		byKind[gvk.Kind] = append(byKind[gvk.Kind], obj)
	}
	return byKind
}
