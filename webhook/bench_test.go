package webhook_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/webhook"
)

// BenchmarkAdmission sends the webhook server the AdmissionReview the
// apiserver sends for an annotated pod, over HTTPS with the server's real
// certificate, and reports p50 and p99 per request (target p99 <= 5ms).
// Run: make bench, or go test -run '^$' -bench Admission ./webhook
func BenchmarkAdmission(b *testing.B) {
	env := kubetest.Get(b)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.Webhook.LocalServingCAData)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	url := "https://" + net.JoinHostPort(env.Webhook.LocalServingHost, strconv.Itoa(env.Webhook.LocalServingPort)) + webhook.Path

	pod, err := json.Marshal(newPod("worker", map[string]string{"handoff.dev/inject": "true", "handoff.dev/leases": "work"}))
	if err != nil {
		b.Fatal(err)
	}
	review := func(i int) []byte {
		r := admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{
				UID:       types.UID(fmt.Sprintf("req-%d", i)),
				Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
				Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
				Namespace: "bench", Operation: admissionv1.Create,
				Object: runtime.RawExtension{Raw: pod},
			},
		}
		out, _ := json.Marshal(r)
		return out
	}
	send := func(i int) time.Duration {
		start := time.Now()
		resp, err := client.Post(url, "application/json", bytes.NewReader(review(i)))
		if err != nil {
			b.Fatal(err)
		}
		var got admissionv1.AdmissionReview
		err = json.NewDecoder(resp.Body).Decode(&got)
		_ = resp.Body.Close()
		took := time.Since(start)
		if err != nil || got.Response == nil || !got.Response.Allowed || len(got.Response.Patch) == 0 {
			b.Fatalf("answer %+v, %v: want an allowed response with a patch", got.Response, err)
		}
		return took
	}
	send(0) // the TLS handshake, once, as the apiserver keeps its connection
	var d []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		d = append(d, send(i))
	}
	b.StopTimer()
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(d[min(len(d)-1, len(d)*99/100)].Microseconds())/1000, "p99-ms")
}
