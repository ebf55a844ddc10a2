package inject_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var opts = inject.Options{
	Image:           "ghcr.io/handoff-dev/handoff:v0.1.0",
	ImagePullPolicy: corev1.PullIfNotPresent,
	Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
	},
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./inject -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test ./inject -update rewrites it after review); got:\n%s", path, got)
	}
}

func TestManifestsGolden(t *testing.T) {
	in, err := os.ReadFile("testdata/workloads.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	changes, err := inject.Manifests(bytes.NewReader(in), &out, opts)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "workloads.golden.yaml", out.Bytes())

	want := map[string]inject.Result{"orders": inject.Injected, "ledger": inject.Injected, "node-sweeper": inject.Injected,
		"backfill": inject.Injected, "nightly": inject.Injected, "mailer": inject.Injected, "wrapped": inject.Injected,
		"web": inject.Skipped, "settings": inject.Skipped, "in-a-list": inject.Injected}
	for _, c := range changes {
		if want[c.Name] != c.Result {
			t.Errorf("%s %s: %s, want %s", c.Kind, c.Name, c.Result, want[c.Name])
		}
		delete(want, c.Name)
	}
	if len(want) > 0 {
		t.Errorf("objects not reported: %v", want)
	}

	// Injecting the output again changes nothing.
	var again bytes.Buffer
	changes, err = inject.Manifests(bytes.NewReader(out.Bytes()), &again, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), out.Bytes()) {
		t.Errorf("second injection changed the output:\n%s", again.Bytes())
	}
	for _, c := range changes {
		if c.Result == inject.Injected {
			t.Errorf("%s %s injected twice", c.Kind, c.Name)
		}
	}
}

func pod(annotations map[string]string, containers ...corev1.Container) (*metav1.ObjectMeta, *corev1.PodSpec) {
	if len(containers) == 0 {
		containers = []corev1.Container{{Name: "worker", Image: "w"}}
	}
	return &metav1.ObjectMeta{Name: "p", Annotations: annotations}, &corev1.PodSpec{Containers: containers}
}

func TestPodRefusesWithNamedCause(t *testing.T) {
	on := func(kv ...string) map[string]string {
		m := map[string]string{"handoff.dev/inject": "true"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	hooked := func(h corev1.LifecycleHandler) corev1.Container {
		return corev1.Container{Name: "worker", Image: "w", Lifecycle: &corev1.Lifecycle{PreStop: &h}}
	}
	cases := []struct {
		name        string
		annotations map[string]string
		containers  []corev1.Container
		grace       *int64
		want        []string // all must appear in the error
	}{
		{"inject not a bool", map[string]string{"handoff.dev/inject": "yes"}, nil, nil,
			[]string{"handoff.dev/inject", `"yes"`, `"true" or "false"`}},
		{"bad layout", on("handoff.dev/layout", "sideways"), nil, nil,
			[]string{"handoff.dev/layout", `"sideways"`, `"native" or "legacy"`}},
		{"misspelt key", on("handoff.dev/lease", "work"), nil, nil,
			[]string{"handoff.dev/lease:", "not a handoff annotation", "handoff.dev/leases"}},
		{"bad duration", on("handoff.dev/lease-duration", "fast"), nil, nil,
			[]string{"handoff.dev/lease-duration", "fast", "a duration of at least 2s"}},
		{"bad fallback", on("handoff.dev/fallback", "drop"), nil, nil,
			[]string{"handoff.dev/fallback", "drop", "one of return, cancel, abandon"}},
		{"no such container", on("handoff.dev/container", "app"), nil, nil,
			[]string{"handoff.dev/container", `"app"`, "worker"}},
		{"own preStop", on(), []corev1.Container{hooked(corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"x"}}})}, nil,
			[]string{"spec.containers[worker].lifecycle.preStop", "handoff.dev/wrap-prestop"}},
		{"httpGet preStop wrapped", on("handoff.dev/wrap-prestop", "true"), []corev1.Container{hooked(corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/"}})}, nil,
			[]string{"spec.containers[worker].lifecycle.preStop", "only exec and sleep"}},
		{"grace too short", on(), nil, ptr.To[int64](4),
			[]string{"spec.terminationGracePeriodSeconds 4", "handoff.dev/deadline-margin (2s)", "handoff.dev/handback-reserve (2s)"}},
		{"name taken", on(), []corev1.Container{{Name: "worker"}, {Name: "handoff"}}, nil,
			[]string{"spec.containers", `"handoff"`, "rename it"}},
		{"several at once", on("handoff.dev/layout", "x", "handoff.dev/retry-period", "0"), nil, nil,
			[]string{"handoff.dev/layout", "handoff.dev/retry-period"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			meta, spec := pod(tc.annotations, tc.containers...)
			spec.TerminationGracePeriodSeconds = tc.grace
			before := spec.DeepCopy()
			_, err := inject.Pod(meta, spec, opts)
			if err == nil {
				t.Fatal("injected; want a refusal")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if meta.Annotations["handoff.dev/status"] != "" || len(spec.InitContainers) != len(before.InitContainers) || len(spec.Containers) != len(before.Containers) {
				t.Error("a refused pod was changed")
			}
		})
	}
}

func TestPodLeavesOthersAlone(t *testing.T) {
	for _, a := range []map[string]string{nil, {"handoff.dev/inject": "false"}, {"handoff.dev/leases": "x"}} {
		meta, spec := pod(a)
		before := spec.DeepCopy()
		res, err := inject.Pod(meta, spec, opts)
		if err != nil || res != inject.Skipped {
			t.Errorf("annotations %v: %s, %v; want skipped", a, res, err)
		}
		if len(spec.InitContainers) != len(before.InitContainers) || spec.Containers[0].Lifecycle != nil {
			t.Errorf("annotations %v: pod changed", a)
		}
	}
}

func TestAnnotationsDoc(t *testing.T) {
	path := filepath.Join("..", "docs", "annotations.md")
	got := []byte(inject.Markdown())
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s is not inject.Markdown() (%v); run go test ./inject -run TestAnnotationsDoc -update", path, err)
	}
}
