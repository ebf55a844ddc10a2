// Package webhook is the mutating admission webhook that adds the handoff
// sidecar to pods: inject.Pod behind controller-runtime's admission
// handling. Deployments and the other workloads get the sidecar in the pods
// their controllers create.
package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	jsonpatch5 "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/handoff-dev/handoff/inject"
)

// Path is where the webhook server serves pod injection.
const Path = "/inject-pod"

// Outcomes counted by handoff_webhook_admissions_total.
const (
	OutcomeInjected = "injected"
	OutcomeSkipped  = "skipped"
	OutcomeAlready  = "already-injected"
	OutcomeRefused  = "refused"
	OutcomeError    = "error"
)

// Injector answers pod admission requests.
type Injector struct {
	options    inject.Options
	decoder    admission.Decoder
	admissions *prometheus.CounterVec
	refusals   *prometheus.CounterVec
	log        logr.Logger
}

// NewInjector returns an Injector adding the sidecar with o, counting its
// outcomes in reg as handoff_webhook_admissions_total{outcome}, and the
// causes of its refusals as handoff_webhook_refusals_total{reason} (the
// codes of inject.Reason; a pod refused for two causes counts once in each,
// and once as outcome refused). Latency is controller-runtime's
// controller_runtime_webhook_latency_seconds.
func NewInjector(o inject.Options, reg prometheus.Registerer, log logr.Logger) *Injector {
	admissions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "handoff_webhook_admissions_total",
		Help: "Pod admission requests by outcome: injected, skipped, already-injected, refused, error.",
	}, []string{"outcome"})
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "handoff_webhook_refusals_total",
		Help: "Causes of refused pods, by reason code (inject.Reason); a pod refused for several causes counts in each.",
	}, []string{"reason"})
	// Every outcome exists at 0 from the start, so that an alert's rate
	// sees the first refusal or error.
	for _, o := range []string{OutcomeInjected, OutcomeSkipped, OutcomeAlready, OutcomeRefused, OutcomeError} {
		admissions.WithLabelValues(o)
	}
	reg.MustRegister(admissions, refusals)
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme) // the built-in types always register
	return &Injector{options: o, decoder: admission.NewDecoder(scheme), admissions: admissions, refusals: refusals, log: log}
}

// Register serves the Injector at Path on srv.
func (i *Injector) Register(srv webhook.Server) {
	srv.Register(Path, &admission.Webhook{Handler: i})
}

// Handle injects the pod in req, refusing it with a message that names each
// problem when its handoff annotations are invalid or the pod cannot run
// the sidecar.
//
// The answer's JSON patch holds only what inject.Pod changed: it is the
// difference between the typed pod before and after inject.Pod, both
// encoded by the same compiled types, so a field those types do not know
// (a newer API's) is in neither and the patch leaves it alone. Diffing
// against the raw request instead would remove every such field. Handle
// checks that the patch applies to the raw object before answering.
// An injected pod's answer carries inject.Warnings, which the API server
// passes on to the pod's creator.
func (i *Injector) Handle(_ context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := i.decoder.Decode(req, pod); err != nil {
		i.admissions.WithLabelValues(OutcomeError).Inc()
		return admission.Errored(http.StatusBadRequest, err)
	}
	name := pod.Name
	if name == "" {
		name = pod.GenerateName + "*"
	}
	before, err := json.Marshal(pod)
	if err != nil {
		i.admissions.WithLabelValues(OutcomeError).Inc()
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encoding the pod: %w", err))
	}
	res, err := inject.Pod(&pod.ObjectMeta, &pod.Spec, i.options)
	if err != nil {
		i.admissions.WithLabelValues(OutcomeRefused).Inc()
		reasons := inject.Reasons(err)
		for _, r := range reasons {
			i.refusals.WithLabelValues(string(r)).Inc()
		}
		i.log.Info("refused", "pod", req.Namespace+"/"+name, "reasons", reasons, "error", err.Error())
		return admission.Denied("handoff: " + strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if res != inject.Injected {
		i.admissions.WithLabelValues(string(res)).Inc()
		return admission.Allowed(string(res))
	}
	patch, err := mutationPatch(req.Object.Raw, before, pod)
	if err != nil {
		i.admissions.WithLabelValues(OutcomeError).Inc()
		return admission.Errored(http.StatusInternalServerError, err)
	}
	i.admissions.WithLabelValues(OutcomeInjected).Inc()
	i.log.V(1).Info("injected", "pod", req.Namespace+"/"+name)
	return admission.Patched("", patch...).WithWarnings(inject.Warnings(&pod.Spec)...)
}

// mutationPatch is the JSON patch (RFC 6902) from before, the typed
// encoding of the pod as decoded, to the injected pod, once checked to
// apply to raw, the object as the apiserver sent it. An error means the
// patch would not apply: answering with it would fail the request anyway.
func mutationPatch(raw, before []byte, injected *corev1.Pod) ([]jsonpatch.JsonPatchOperation, error) {
	after, err := json.Marshal(injected)
	if err != nil {
		return nil, fmt.Errorf("encoding the injected pod: %w", err)
	}
	ops, err := jsonpatch.CreatePatch(before, after)
	if err != nil {
		return nil, fmt.Errorf("computing the injection patch: %w", err)
	}
	encoded, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("encoding the injection patch: %w", err)
	}
	p, err := jsonpatch5.DecodePatch(encoded)
	if err == nil {
		_, err = p.Apply(raw)
	}
	if err != nil {
		return nil, fmt.Errorf("the injection patch does not apply to the pod as sent: %w", err)
	}
	return ops, nil
}
