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

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
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
	log        logr.Logger
}

// NewInjector returns an Injector adding the sidecar with o, counting its
// outcomes in reg as handoff_webhook_admissions_total{outcome}. Latency is
// controller-runtime's controller_runtime_webhook_latency_seconds.
func NewInjector(o inject.Options, reg prometheus.Registerer, log logr.Logger) *Injector {
	admissions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "handoff_webhook_admissions_total",
		Help: "Pod admission requests by outcome: injected, skipped, already-injected, refused, error.",
	}, []string{"outcome"})
	reg.MustRegister(admissions)
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme) // the built-in types always register
	return &Injector{options: o, decoder: admission.NewDecoder(scheme), admissions: admissions, log: log}
}

// Register serves the Injector at Path on srv.
func (i *Injector) Register(srv webhook.Server) {
	srv.Register(Path, &admission.Webhook{Handler: i})
}

// Handle injects the pod in req, refusing it with a message that names each
// problem when its handoff annotations are invalid.
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
	res, err := inject.Pod(&pod.ObjectMeta, &pod.Spec, i.options)
	if err != nil {
		i.admissions.WithLabelValues(OutcomeRefused).Inc()
		i.log.Info("refused", "pod", req.Namespace+"/"+name, "error", err.Error())
		return admission.Denied("handoff: " + strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if res != inject.Injected {
		i.admissions.WithLabelValues(string(res)).Inc()
		return admission.Allowed(string(res))
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		i.admissions.WithLabelValues(OutcomeError).Inc()
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encoding the injected pod: %w", err))
	}
	i.admissions.WithLabelValues(OutcomeInjected).Inc()
	i.log.V(1).Info("injected", "pod", req.Namespace+"/"+name)
	return admission.PatchResponseFromRaw(req.Object.Raw, raw)
}
