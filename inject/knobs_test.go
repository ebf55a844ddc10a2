package inject_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/handoff-dev/handoff/inject"
)

// containers returns the install step and the sidecar of an injected pod.
func handoffContainers(t *testing.T, spec *corev1.PodSpec) []corev1.Container {
	t.Helper()
	var out []corev1.Container
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if c.Name == inject.InstallName || c.Name == inject.SidecarName {
			out = append(out, c)
		}
	}
	if len(out) != 2 {
		t.Fatalf("found %d of handoff's containers, want the install step and the sidecar", len(out))
	}
	return out
}

// A pod's handoff.dev/sidecar-* annotations replace the injector's
// resources one quantity each, for the sidecar and its install step; the
// others stay the injector's.
func TestSidecarResourcesByAnnotation(t *testing.T) {
	meta, spec := pod(map[string]string{"handoff.dev/inject": "true",
		inject.AnnotationSidecarCPURequest: "100m", inject.AnnotationSidecarCPULimit: "1",
		inject.AnnotationSidecarMemoryLimit: "256Mi"}, corev1.Container{Name: "worker"})
	if res, err := inject.Pod(meta, spec, opts); err != nil || res != inject.Injected {
		t.Fatalf("inject: %s, %v", res, err)
	}
	want := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	for _, c := range handoffContainers(t, spec) {
		for _, l := range []struct {
			what      string
			got, want corev1.ResourceList
		}{{"requests", c.Resources.Requests, want.Requests}, {"limits", c.Resources.Limits, want.Limits}} {
			if len(l.got) != len(l.want) {
				t.Errorf("%s %s: %v, want %v", c.Name, l.what, l.got, l.want)
			}
			for k, v := range l.want {
				if g := l.got[k]; g.Cmp(v) != 0 {
					t.Errorf("%s %s[%s] = %s, want %s", c.Name, l.what, k, g.String(), v.String())
				}
			}
		}
	}
	// The injector's own resources are not changed for the next pod.
	if q := opts.Resources.Requests[corev1.ResourceCPU]; q.String() != "10m" || opts.Resources.Limits[corev1.ResourceCPU] != (resource.Quantity{}) {
		t.Errorf("the injector's resources changed: %v", opts.Resources)
	}
}

// A bad quantity, or a request above its limit once the pod's annotations
// replace the injector's, is refused naming the annotation (and the
// default it meets) and the accepted form, before the API server would
// refuse the pod with a message that names no annotation.
func TestSidecarResourcesRefused(t *testing.T) {
	cases := []struct {
		name string
		a    map[string]string
		want []string
	}{
		{"not a quantity", map[string]string{inject.AnnotationSidecarCPURequest: "lots"},
			[]string{"annotation handoff.dev/sidecar-cpu-request", `"lots"`, "a Kubernetes quantity above 0"}},
		{"zero", map[string]string{inject.AnnotationSidecarMemoryLimit: "0"},
			[]string{"annotation handoff.dev/sidecar-memory-limit", `"0"`, "above 0"}},
		{"negative", map[string]string{inject.AnnotationSidecarCPULimit: "-1"},
			[]string{"annotation handoff.dev/sidecar-cpu-limit", `"-1"`}},
		{"request above the injector's limit", map[string]string{inject.AnnotationSidecarMemoryRequest: "100Mi"},
			[]string{"annotation handoff.dev/sidecar-memory-request 100Mi is above the memory limit 64Mi of the injector's default (--sidecar-memory-limit)", "set handoff.dev/sidecar-memory-limit too"}},
		{"limit below the injector's request", map[string]string{inject.AnnotationSidecarCPULimit: "5m"},
			[]string{"the injector's default (--sidecar-cpu-request) 10m is above the cpu limit 5m of annotation handoff.dev/sidecar-cpu-limit"}},
		{"both given, crossed", map[string]string{inject.AnnotationSidecarCPURequest: "2", inject.AnnotationSidecarCPULimit: "1"},
			[]string{"annotation handoff.dev/sidecar-cpu-request 2 is above the cpu limit 1 of annotation handoff.dev/sidecar-cpu-limit"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := map[string]string{"handoff.dev/inject": "true"}
			for k, v := range tc.a {
				a[k] = v
			}
			meta, spec := pod(a, corev1.Container{Name: "worker"})
			_, err := inject.Pod(meta, spec, opts)
			if err == nil {
				t.Fatal("injected; want a refusal")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if !slices.Equal(inject.Reasons(err), []inject.Reason{inject.ReasonInvalidAnnotation}) {
				t.Errorf("reasons %v, want %s", inject.Reasons(err), inject.ReasonInvalidAnnotation)
			}
			if len(spec.InitContainers) != 0 {
				t.Error("a refused pod was changed")
			}
		})
	}
}

// The injector's user and group ids: 65532 by default, another when given,
// and none with OmitID (a platform such as OpenShift's restricted-v2
// assigns its own), runAsNonRoot true always. The install step runs as the
// worker's user when the pod names one, whatever the injector's.
func TestSidecarUserIDs(t *testing.T) {
	check := func(what string, o inject.Options, workerUser *int64, wantUser, wantGroup *int64, wantInstallUser *int64) {
		t.Helper()
		w := corev1.Container{Name: "worker"}
		if workerUser != nil {
			w.SecurityContext = &corev1.SecurityContext{RunAsUser: workerUser}
		}
		meta, spec := pod(map[string]string{"handoff.dev/inject": "true"}, w)
		if _, err := inject.Pod(meta, spec, o); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for _, c := range handoffContainers(t, spec) {
			sc := c.SecurityContext
			user := wantUser
			if c.Name == inject.InstallName {
				user = wantInstallUser
			}
			if !eqPtr(sc.RunAsUser, user) || !eqPtr(sc.RunAsGroup, wantGroup) {
				t.Errorf("%s: %s runs as user %v group %v, want %v %v", what, c.Name, show(sc.RunAsUser), show(sc.RunAsGroup), show(user), show(wantGroup))
			}
			if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
				t.Errorf("%s: %s runAsNonRoot %v, want true", what, c.Name, sc.RunAsNonRoot)
			}
		}
	}
	i := func(v int64) *int64 { return &v }
	check("default", opts, nil, i(65532), i(65532), i(65532))
	other := opts
	other.RunAsUser, other.RunAsGroup = 1000, 2000
	check("given", other, nil, i(1000), i(2000), i(1000))
	omit := opts
	omit.RunAsUser, omit.RunAsGroup = inject.OmitID, inject.OmitID
	check("omitted", omit, nil, nil, nil, nil)
	check("omitted, the worker's user known", omit, i(1001), nil, nil, i(1001))
}

func eqPtr(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func show(p *int64) any {
	if p == nil {
		return "unset"
	}
	return *p
}
