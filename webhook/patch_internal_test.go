package webhook

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/inject"
)

// A patch that would not apply to the pod as sent is an error, not an
// answer the apiserver would fail on.
func TestMutationPatchMustApplyToTheRawPod(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{"handoff.dev/inject": "true"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "w"}}},
	}
	before, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inject.Pod(&pod.ObjectMeta, &pod.Spec, inject.Options{Image: "handoff:test"}); err != nil {
		t.Fatal(err)
	}
	if ops, err := mutationPatch(before, before, pod); err != nil || len(ops) == 0 {
		t.Fatalf("patch %v, %v; want a patch applying to the pod it came from", ops, err)
	}
	// A raw pod without the containers the typed one has: the patch's
	// paths into spec.containers[0] do not exist there.
	_, err = mutationPatch([]byte(`{"metadata":{"name":"p","annotations":{"handoff.dev/inject":"true"}},"spec":{}}`), before, pod)
	if err == nil || !strings.Contains(err.Error(), "the injection patch does not apply to the pod as sent") {
		t.Errorf("error %v; want the patch refused as not applying", err)
	}
}
