package webhook

import (
	"net/http"

	"k8s.io/apimachinery/pkg/fields"
)

// RotatorReadsByName returns a wrapper for rest.Config.Wrap that narrows
// cert-controller's reads to the two objects it keeps: the Secret secret in
// namespace and the MutatingWebhookConfiguration config.
//
// cert-controller (v0.16) reads them through informers of its own cache,
// which list and watch every Secret of the namespace and every
// MutatingWebhookConfiguration of the cluster, with no way to narrow them
// (its open pull request 228 would add one). RBAC can grant list and watch
// of one object by name only when the request names it, with the field
// selector metadata.name=<name>. The wrapper adds that selector to each
// list and watch (GET) of those two collections that has no field selector
// of its own, so the informers hold the one object each and the webhook's
// Role and ClusterRole grant them by resourceNames. Other requests pass
// unchanged.
func RotatorReadsByName(namespace, secret, config string) func(http.RoundTripper) http.RoundTripper {
	names := map[string]string{
		"/api/v1/namespaces/" + namespace + "/secrets":                        secret,
		"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations": config,
	}
	return func(next http.RoundTripper) http.RoundTripper { return byName{next: next, names: names} }
}

// byName adds fieldSelector=metadata.name=names[path] to a GET of a
// collection path in names without a field selector.
type byName struct {
	next  http.RoundTripper
	names map[string]string // collection path: the one name to read
}

func (b byName) RoundTrip(req *http.Request) (*http.Response, error) {
	name, ok := b.names[req.URL.Path]
	if !ok || req.Method != http.MethodGet || req.URL.Query().Has("fieldSelector") {
		return b.next.RoundTrip(req)
	}
	// A RoundTripper must not change the request it is given.
	req = req.Clone(req.Context())
	q := req.URL.Query()
	q.Set("fieldSelector", fields.OneTermEqualSelector("metadata.name", name).String())
	req.URL.RawQuery = q.Encode()
	return b.next.RoundTrip(req)
}
