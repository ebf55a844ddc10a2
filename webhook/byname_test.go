package webhook_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/handoff-dev/handoff/webhook"
)

type recorder struct{ got *http.Request }

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.got = req
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
}

// The rotator's list and watch of its two collections name its one object;
// every other request is sent as it was, and the caller's request is not
// changed.
func TestRotatorReadsByName(t *testing.T) {
	wrap := webhook.RotatorReadsByName("handoff", "handoff-webhook-cert", "handoff")
	for _, tc := range []struct {
		method, url, wantQuery string
	}{
		{"GET", "/api/v1/namespaces/handoff/secrets?limit=500&resourceVersion=0", "fieldSelector=metadata.name%3Dhandoff-webhook-cert&limit=500&resourceVersion=0"},
		{"GET", "/api/v1/namespaces/handoff/secrets?watch=true&resourceVersion=7", "fieldSelector=metadata.name%3Dhandoff-webhook-cert&resourceVersion=7&watch=true"},
		{"GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations?watch=true", "fieldSelector=metadata.name%3Dhandoff&watch=true"},
		// Not a list or watch of those collections, or already selected.
		{"GET", "/api/v1/namespaces/handoff/secrets/handoff-webhook-cert", ""},
		{"PUT", "/api/v1/namespaces/handoff/secrets", ""},
		{"GET", "/api/v1/namespaces/other/secrets", ""},
		{"GET", "/api/v1/secrets", ""},
		{"GET", "/api/v1/namespaces/handoff/secrets?fieldSelector=type%3DOpaque", "fieldSelector=type%3DOpaque"},
		{"GET", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", ""},
	} {
		rec := &recorder{}
		u, err := url.Parse("https://apiserver:6443" + tc.url)
		if err != nil {
			t.Fatal(err)
		}
		req := &http.Request{Method: tc.method, URL: u, Header: http.Header{}}
		before := u.RawQuery
		res, err := wrap(rec).RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if rec.got.URL.Path != u.Path || rec.got.URL.RawQuery != tc.wantQuery && tc.wantQuery != "" || tc.wantQuery == "" && rec.got.URL.RawQuery != before {
			t.Errorf("%s %s sent as %s?%s; want the query %q", tc.method, tc.url, rec.got.URL.Path, rec.got.URL.RawQuery, tc.wantQuery)
		}
		if req.URL.RawQuery != before {
			t.Errorf("%s %s: the caller's request was changed to %s", tc.method, tc.url, req.URL)
		}
	}
}
