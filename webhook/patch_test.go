package webhook_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/handoff-dev/handoff/inject"
)

// futurePod is a pod as a newer apiserver could send it: fields the
// compiled k8s.io/api types do not know, in the spec, in the worker
// container, next to fields the injection changes (lifecycle, volume
// mounts), in a volume, and in metadata.
const futurePod = `{
  "apiVersion": "v1", "kind": "Pod",
  "metadata": {"name": "future", "namespace": "shop", "futureMeta": {"a": 1},
    "annotations": {"handoff.dev/inject": "true", "handoff.dev/leases": "work"}},
  "spec": {
    "someFutureField": {"enabled": true, "list": [1, 2]},
    "containers": [{
      "name": "worker", "image": "worker:1", "futureField": "keep me",
      "lifecycle": {"futureHook": {"x": 1}},
      "volumeMounts": [{"name": "data", "mountPath": "/data", "futureMountField": true}],
      "resources": {"futureResourceField": "y"}
    }, {"name": "helper", "image": "helper:1", "futureField": 2}],
    "volumes": [{"name": "data", "emptyDir": {}, "futureVolumeField": "z"}]
  },
  "futureTopLevel": "t"
}`

// unknownPaths are the fields of futurePod the compiled types drop, as
// JSON pointers, with the value they must keep.
var unknownPaths = map[string]any{
	"/metadata/futureMeta":                               map[string]any{"a": 1.0},
	"/spec/someFutureField":                              map[string]any{"enabled": true, "list": []any{1.0, 2.0}},
	"/spec/containers/0/futureField":                     "keep me",
	"/spec/containers/0/lifecycle/futureHook":            map[string]any{"x": 1.0},
	"/spec/containers/0/volumeMounts/0/futureMountField": true,
	"/spec/containers/0/resources/futureResourceField":   "y",
	"/spec/containers/1/futureField":                     2.0,
	"/spec/volumes/0/futureVolumeField":                  "z",
	"/futureTopLevel":                                    "t",
}

// pointer reads the JSON pointer p in doc (no escapes needed here).
func pointer(doc any, p string) (any, bool) {
	for _, k := range strings.Split(p, "/")[1:] {
		switch d := doc.(type) {
		case map[string]any:
			v, ok := d[k]
			if !ok {
				return nil, false
			}
			doc = v
		case []any:
			var i int
			if err := json.Unmarshal([]byte(k), &i); err != nil || i >= len(d) {
				return nil, false
			}
			doc = d[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

// legacyPod asks for the legacy layout (the sidecar appended to
// spec.containers) and wraps a sleep preStop hook; it has init containers
// and a null volume list, and unknown fields next to each.
const legacyPod = `{
  "apiVersion": "v1", "kind": "Pod",
  "metadata": {"generateName": "legacy-", "namespace": "shop",
    "annotations": {"handoff.dev/inject": "true", "handoff.dev/leases": "work", "handoff.dev/layout": "legacy", "handoff.dev/wrap-prestop": "true"}},
  "spec": {
    "volumes": null,
    "initContainers": [{"name": "migrate", "image": "m:1", "futureInit": "i"}],
    "containers": [{"name": "worker", "image": "worker:1", "futureField": [3],
      "lifecycle": {"preStop": {"sleep": {"seconds": 5}, "futureHandlerOption": "h"}}}],
    "futureSchedulingGate": {"name": "g"}
  }
}`

var legacyUnknown = map[string]any{
	"/spec/initContainers/0/futureInit":                        "i",
	"/spec/containers/0/futureField":                           []any{3.0},
	"/spec/containers/0/lifecycle/preStop/futureHandlerOption": "h",
	"/spec/futureSchedulingGate":                               map[string]any{"name": "g"},
}

// The patch adds the sidecar and keeps every field the compiled types do
// not know: it holds no remove or replace of them, and applied to the raw
// object it gives a pod with both.
func TestPatchKeepsUnknownFields(t *testing.T) {
	t.Run("native", func(t *testing.T) {
		pod := checkPatch(t, futurePod, unknownPaths)
		checkInjected(t, pod, "work")
		if m := pod.Spec.Containers[0].VolumeMounts; len(m) != 3 || m[0].Name != "data" || m[1].Name != inject.VolumeName || m[2].Name != inject.RunVolumeName {
			t.Errorf("worker volume mounts %+v, want data, %s, then %s", m, inject.VolumeName, inject.RunVolumeName)
		}
	})
	t.Run("legacy, wrapped hook", func(t *testing.T) {
		pod := checkPatch(t, legacyPod, legacyUnknown)
		if got := strings.Join(names(pod.Spec.InitContainers), ","); got != "migrate,handoff-install" {
			t.Errorf("init containers %s, want migrate,handoff-install", got)
		}
		if got := strings.Join(names(pod.Spec.Containers), ","); got != "worker,handoff" {
			t.Errorf("containers %s, want worker,handoff", got)
		}
		if got := strings.Join(volumeNames(pod.Spec.Volumes), ","); got != inject.VolumeName+","+inject.RunVolumeName+","+inject.TokenVolumeName {
			t.Errorf("volumes %s, want %s, %s and %s only", got, inject.VolumeName, inject.RunVolumeName, inject.TokenVolumeName)
		}
		h := pod.Spec.Containers[0].Lifecycle.PreStop
		if h.Sleep != nil || h.Exec == nil || !strings.Contains(strings.Join(h.Exec.Command, " "), "--then-sleep 5s") {
			t.Errorf("worker preStop %+v, want handoff prestop ... --then-sleep 5s and no sleep handler", h)
		}
	})
}

// checkPatch sends raw to the injector and checks its patch: no remove or
// replace at or above a path of unknown, and applied to raw each path of
// unknown keeps its value. It returns the patched pod.
func checkPatch(t *testing.T, raw string, unknown map[string]any) *corev1.Pod {
	t.Helper()
	resp := injector.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "1", Operation: admissionv1.Create, Namespace: "shop",
		Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Object:   runtime.RawExtension{Raw: []byte(raw)},
	}})
	if !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("response %+v; want allowed with a patch", resp.Result)
	}
	for _, op := range resp.Patches {
		if op.Operation != "add" {
			for p := range unknown {
				if strings.HasPrefix(p, op.Path) {
					t.Errorf("patch %s %s touches the unknown field %s", op.Operation, op.Path, p)
				}
			}
		}
	}
	encoded, err := json.Marshal(resp.Patches)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(encoded)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply([]byte(raw))
	if err != nil {
		t.Fatalf("the patch does not apply to the raw pod: %v\npatch: %s", err, encoded)
	}
	var doc any
	if err := json.Unmarshal(patched, &doc); err != nil {
		t.Fatal(err)
	}
	for p, want := range unknown {
		if got, ok := pointer(doc, p); !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("after the patch %s = %v (present %v), want %v", p, got, ok, want)
		}
	}
	var pod corev1.Pod
	if err := json.Unmarshal(patched, &pod); err != nil {
		t.Fatal(err)
	}
	return &pod
}

func volumeNames(vs []corev1.Volume) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Name)
	}
	return out
}
