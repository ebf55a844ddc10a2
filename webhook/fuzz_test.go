package webhook_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/webhook"
)

// The admission handler as the webhook server serves it, with panics not
// recovered so that the fuzzer sees them. No control plane: kubetest
// starts none while fuzzing, and these targets need none in a plain run.
func fuzzHandler() http.Handler {
	inj := webhook.NewInjector(inject.Options{Image: "handoff:fuzz", ImagePullPolicy: corev1.PullNever}, prometheus.NewRegistry(), logr.Discard())
	return (&admission.Webhook{Handler: inj}).WithRecoverPanic(false)
}

const podSeed = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"w-0","namespace":"ns","annotations":{"handoff.dev/inject":"true"}},"spec":{"containers":[{"name":"worker","image":"w"}]}}`

// FuzzAdmissionPod sends the admission handler a CREATE review of a fuzzed
// Pod JSON; see checkAdmission for what it checks.
//
// Run: go test ./webhook -run '^$' -fuzz FuzzAdmissionPod (or hack/fuzz.sh).
func FuzzAdmissionPod(f *testing.F) {
	for _, pod := range []string{
		podSeed,
		strings.Replace(podSeed, `"true"`, `"yes"`, 1),
		strings.Replace(podSeed, `"true"`, `true`, 1),
		strings.Replace(podSeed, `"handoff.dev/inject":"true"`, `"handoff.dev/injct":"true"`, 1),
		strings.Replace(podSeed, `"handoff.dev/inject":"true"`, `"handoff.dev/inject":"true","handoff.dev/layout":"legacy","handoff.dev/leases":"work","handoff.dev/fallback":"cancel"`, 1),
		strings.Replace(podSeed, `"handoff.dev/inject":"true"`, `"handoff.dev/inject":"true","handoff.dev/status":"injected"`, 1),
		strings.Replace(podSeed, `"containers":[`, `"terminationGracePeriodSeconds":3,"containers":[`, 1),
		strings.Replace(podSeed, `"containers":[{"name":"worker","image":"w"}]`, `"containers":[]`, 1),
		strings.Replace(podSeed, `"image":"w"`, `"image":"w","lifecycle":{"preStop":{"sleep":{"seconds":5}}}`, 1),
		strings.Replace(podSeed, `"name":"w-0"`, `"generateName":"w-"`, 1),
		strings.Replace(podSeed, `"image":"w"`, `"image":"w","imagePullPolicyy":"Always"`, 1),
		// Out-of-range grace periods and durations, hostPID, a shared
		// process namespace, two containers of one name.
		strings.Replace(podSeed, `"image":"w"`, `"image":"w","livenessProbe":{"exec":{"command":["x"]},"terminationGracePeriodSeconds":10000000000}`, 1),
		strings.Replace(podSeed, `"containers":[`, `"terminationGracePeriodSeconds":9223372036854775807,"containers":[`, 1),
		strings.Replace(podSeed, `"containers":[`, `"terminationGracePeriodSeconds":-9223372037,"containers":[`, 1),
		strings.Replace(podSeed, `"handoff.dev/inject":"true"`, `"handoff.dev/inject":"true","handoff.dev/deadline-margin":"2000000h","handoff.dev/handback-reserve":"2000000h"`, 1),
		strings.Replace(podSeed, `"image":"w"`, `"image":"w","lifecycle":{"preStop":{"sleep":{"seconds":10000000000}}}`, 1),
		strings.Replace(podSeed, `"containers":[`, `"hostPID":true,"containers":[`, 1),
		strings.Replace(podSeed, `"containers":[`, `"shareProcessNamespace":true,"containers":[`, 1),
		strings.Replace(podSeed, `{"name":"worker","image":"w"}`, `{"name":"worker","image":"w"},{"name":"worker","image":"x"}`, 1),
		`{"apiVersion":"v1","kind":"Pod"}`,
		`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"}}`,
		`{}`, `null`, `[]`, `"pod"`, `{"kind":`,
	} {
		f.Add([]byte(pod), "3f1c2a", uint8(0))
	}
	f.Add([]byte(podSeed), "", uint8(1))
	f.Add([]byte(podSeed), "u", uint8(2))
	h := fuzzHandler()
	f.Fuzz(func(t *testing.T, pod []byte, uid string, op uint8) {
		operation := []string{"CREATE", "UPDATE", "DELETE", "CONNECT"}[op%4]
		review, err := json.Marshal(map[string]any{
			"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
			"request": map[string]any{
				"uid": uid, "namespace": "ns", "operation": operation,
				"kind":     map[string]string{"group": "", "version": "v1", "kind": "Pod"},
				"resource": map[string]string{"group": "", "version": "v1", "resource": "pods"},
				"object":   json.RawMessage(pod),
			},
		})
		if err != nil {
			review = []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":` + quote(uid) + `,"object":` + string(pod) + `}}`)
		}
		checkAdmission(t, h, review)
	})
}

// FuzzAdmissionReview sends the admission handler a fuzzed AdmissionReview
// body; see checkAdmission for what it checks.
//
// Run: go test ./webhook -run '^$' -fuzz FuzzAdmissionReview (or hack/fuzz.sh).
func FuzzAdmissionReview(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"operation":"CREATE","object":` + podSeed + `}}`,
		`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"1","object":` + podSeed + `}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1"}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`,
		// Out-of-range grace periods and durations, hostPID, a shared
		// process namespace, two containers of one name.
		strings.Replace(podSeed, `"image":"w"`, `"image":"w","livenessProbe":{"exec":{"command":["x"]},"terminationGracePeriodSeconds":10000000000}`, 1),
		strings.Replace(podSeed, `"containers":[`, `"terminationGracePeriodSeconds":9223372036854775807,"containers":[`, 1),
		strings.Replace(podSeed, `"containers":[`, `"terminationGracePeriodSeconds":-9223372037,"containers":[`, 1),
		strings.Replace(podSeed, `"handoff.dev/inject":"true"`, `"handoff.dev/inject":"true","handoff.dev/deadline-margin":"2000000h","handoff.dev/handback-reserve":"2000000h"`, 1),
		strings.Replace(podSeed, `"image":"w"`, `"image":"w","lifecycle":{"preStop":{"sleep":{"seconds":10000000000}}}`, 1),
		strings.Replace(podSeed, `"containers":[`, `"hostPID":true,"containers":[`, 1),
		strings.Replace(podSeed, `"containers":[`, `"shareProcessNamespace":true,"containers":[`, 1),
		strings.Replace(podSeed, `{"name":"worker","image":"w"}`, `{"name":"worker","image":"w"},{"name":"worker","image":"x"}`, 1),
		`{"apiVersion":"v1","kind":"Pod"}`,
		`{"request":{"uid":"1","object":{"metadata":{"annotations":{"handoff.dev/inject":"true"}},"spec":{"containers":[{"name":"w"}]}}}}`,
		`{"request":{"uid":"1","object":{"metadata":{"annotations":{"handoff.dev/inject":"true"}},"spec":{"containers":[{"name":"w"}]}},"oldObject":{}}}`,
		``, `{`, `null`, `[]`,
	} {
		f.Add([]byte(s))
	}
	h := fuzzHandler()
	f.Fuzz(func(t *testing.T, review []byte) {
		checkAdmission(t, h, review)
	})
}

// checkAdmission posts review to h and checks the answer: HTTP 200 with an
// AdmissionReview whose response carries the request's UID and is either
// allowed or refused with a message. An allowed response with a patch is a
// JSON patch that applies to the pod and gives a pod that the handler then
// leaves alone, allowed with no patch.
func checkAdmission(t *testing.T, h http.Handler, review []byte) {
	t.Helper()
	res := admit(t, h, review)
	var req admissionv1.AdmissionReview
	if err := utiljson.Unmarshal(review, &req); err == nil && req.Request != nil && res.UID != req.Request.UID {
		// The handler decodes with the API machinery's decoder, which may
		// read a body encoding/json refuses, never the other way round.
		t.Fatalf("response UID %q, request UID %q", res.UID, req.Request.UID)
	}
	if !res.Allowed {
		if res.Result == nil || strings.TrimSpace(res.Result.Message) == "" {
			t.Fatalf("refused without a message: %+v", res)
		}
		return
	}
	if res.Patch == nil {
		return
	}
	if res.PatchType == nil || *res.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch of type %v", res.PatchType)
	}
	patch, err := jsonpatch.DecodePatch(res.Patch)
	if err != nil {
		t.Fatalf("patch %s: %v", res.Patch, err)
	}
	// The apiserver sends an object it encoded itself: apply the patch to
	// the pod as a JSON value (duplicate keys merged, as a decoder reads
	// them), not to the fuzzed bytes.
	var original any
	d := json.NewDecoder(bytes.NewReader(req.Request.Object.Raw))
	d.UseNumber()
	if err := d.Decode(&original); err != nil {
		t.Fatalf("patched a pod that is not JSON: %s: %v", req.Request.Object.Raw, err)
	}
	raw, err := json.Marshal(original)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("patch %s does not apply to %s: %v", res.Patch, req.Request.Object.Raw, err)
	}
	// Not strict: the patch keeps fields the compiled types do not know
	// (TestPatchKeepsUnknownFields checks that they survive).
	var pod corev1.Pod
	if err := json.Unmarshal(patched, &pod); err != nil {
		t.Fatalf("patched pod %s: %v", patched, err)
	}
	if pod.Annotations[inject.AnnotationStatus] != inject.StatusInjected {
		t.Fatalf("patched pod %s is not marked injected", patched)
	}
	req.Request.Object.Raw = patched
	again, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if res := admit(t, h, again); !res.Allowed || res.Patch != nil {
		t.Fatalf("the patched pod %s: allowed %v, patch %s; want it left alone", patched, res.Allowed, res.Patch)
	}
}

func admit(t *testing.T, h http.Handler, review []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, webhook.Path, bytes.NewReader(review))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", w.Code, w.Body.Bytes())
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
		t.Fatalf("answer %s is not an AdmissionReview with a response: %v", w.Body.Bytes(), err)
	}
	return out.Response
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
