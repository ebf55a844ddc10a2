package kube

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/inject"
)

const (
	// NotFinished is the field selector that leaves out the pods whose
	// containers have all ended (a Job's): they run no sidecar any more.
	NotFinished = "status.phase!=Succeeded,status.phase!=Failed"
	// ListPage is how many pods (or Leases) one list call returns at most.
	ListPage = 500
	// UnknownVersion stands for the version of a pod that carries none: a
	// pod injected before handoff.dev/version existed, or a webhook pod
	// with neither the label app.kubernetes.io/version nor an image tag.
	UnknownVersion = "unknown"
)

// SidecarSelector is the label selector of the injected pods.
var SidecarSelector = inject.LabelInjected + "=true"

// SidecarEnv looks up the environment of p's sidecar container (the first
// container or init container named inject.SidecarName) by variable name:
// its values as written, as injection writes them; a reference (valueFrom)
// is not found.
func SidecarEnv(p *corev1.Pod) func(name string) (string, bool) {
	var env []corev1.EnvVar
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		if c.Name == inject.SidecarName {
			env = c.Env
			break
		}
	}
	return func(name string) (string, bool) {
		for _, e := range env {
			if e.Name == name && e.ValueFrom == nil {
				return e.Value, true
			}
		}
		return "", false
	}
}

// PodSettings loads the settings of p's sidecar as the sidecar loads them
// (config.Load), from its container's environment (SidecarEnv), then from
// more (like config.Annotations of the pod), else the defaults. The pod's
// identity, which its environment has from the downward API, comes from
// the pod itself, and the token file is one never read. Its error is
// config.Load's: every setting that does not parse, or that does not fit
// with another, named.
func PodSettings(p *corev1.Pod, more ...config.Source) (*config.Settings, error) {
	identity := map[string]string{"pod-name": p.Name, "pod-namespace": p.Namespace, "pod-uid": string(p.UID), "token-file": "/dev/null"}
	sources := append([]config.Source{config.Map(identity, "the pod"), config.Environ(SidecarEnv(p))}, more...)
	return config.Load(sources...)
}

// SidecarSetting is the value of p's sidecar setting name as written
// (like "orders-{0..3}" for shards), from the first source PodSettings
// reads that has it: the sidecar's environment, then more; "" when none
// has it.
func SidecarSetting(p *corev1.Pod, name string, more ...config.Source) string {
	d, ok := config.Lookup(name)
	if !ok {
		return ""
	}
	for _, src := range append([]config.Source{config.Environ(SidecarEnv(p))}, more...) {
		if v, _, ok := src(d); ok {
			return v
		}
	}
	return ""
}
