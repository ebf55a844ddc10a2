package inject

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/handoff-dev/handoff/config"
)

// Annotation keys that drive injection. The sidecar's own settings are
// annotations too; their keys, defaults and forms are in config.Table.
const (
	AnnotationInject      = config.AnnotationPrefix + "inject"
	AnnotationLayout      = config.AnnotationPrefix + "layout"
	AnnotationContainer   = config.AnnotationPrefix + "container"
	AnnotationWrapPreStop = config.AnnotationPrefix + "wrap-prestop"
	AnnotationStatus      = config.AnnotationPrefix + "status"
	// AnnotationVersion is set by Pod on every pod it injects: the version
	// of handoff that injected it (Options.Version), which is the sidecar's
	// when the image is the default one. A value the pod had is replaced.
	AnnotationVersion = config.AnnotationPrefix + "version"
	// AnnotationAllowSharedProcessNamespace "true" injects a pod with
	// spec.shareProcessNamespace true, which is refused without it.
	AnnotationAllowSharedProcessNamespace = config.AnnotationPrefix + "allow-shared-process-namespace"
	// The sidecar's (and its install step's) resources for this pod, one
	// quantity each, in place of the injector's (Options.Resources, the
	// chart's sidecar.resources), as Linkerd's
	// config.linkerd.io/proxy-cpu-request and Dapr's
	// dapr.io/sidecar-cpu-limit do.
	AnnotationSidecarCPURequest    = config.AnnotationPrefix + "sidecar-cpu-request"
	AnnotationSidecarCPULimit      = config.AnnotationPrefix + "sidecar-cpu-limit"
	AnnotationSidecarMemoryRequest = config.AnnotationPrefix + "sidecar-memory-request"
	AnnotationSidecarMemoryLimit   = config.AnnotationPrefix + "sidecar-memory-limit"
)

// LabelInject is the pod label that asks for injection, as the annotation
// of the same key does. The chart's webhook is sent only pods with this
// label "true" by default (its values' webhook.selectBy), since the API
// server can select the pods it sends by label but not by annotation.
const LabelInject = config.AnnotationPrefix + "inject"

// LabelInjected is the label Pod sets, "true", on every pod it injects,
// beside AnnotationStatus: a NetworkPolicy can select pods by label, never
// by annotation, and the chart's policy for the sidecar's metrics and probe
// port selects the injected pods with it (networkPolicy.sidecar).
const LabelInjected = config.AnnotationPrefix + "injected"

// LabelVersion is the label Pod sets beside AnnotationVersion, to the same
// version, so that the API server can select the pods of one sidecar
// version (kubectl get pods -A -l 'handoff.dev/injected,handoff.dev/version!=v0.2.0'
// lists those that run another or an unknown one; `handoff version` counts
// them). A version that is not a valid label value (63 characters of
// [A-Za-z0-9._-]; none that hack/version.sh prints) gets no label, and a
// label the pod had is removed.
const LabelVersion = config.AnnotationPrefix + "version"

// Layouts, the values of AnnotationLayout.
const (
	// LayoutNative runs the sidecar as an init container with restartPolicy
	// Always (a native sidecar, on by default since Kubernetes 1.29): it starts before
	// the worker and stops after it.
	LayoutNative = "native"
	// LayoutLegacy runs the sidecar as a plain container whose own preStop
	// hook waits for the handover, so the kubelet's SIGTERM reaches it only
	// once the handover is over.
	LayoutLegacy = "legacy"
)

// StatusInjected is the value of AnnotationStatus on an injected pod.
const StatusInjected = "injected"

// Key documents one injection annotation.
type Key struct {
	Key, Default, Form, Usage string
	// Mark is set for an annotation that Pod writes on the pods it injects
	// rather than one that configures injection.
	Mark bool
	// valid reports whether v is accepted; nil accepts anything.
	valid func(v string) bool
}

// Keys lists the injection annotations, in documentation order.
var Keys = []Key{
	{Key: AnnotationInject, Default: "false", Form: `"true" or "false"`, valid: isBool,
		Usage: "add the handoff sidecar to this pod, as the label of the same key does; without either the pod is left alone. The chart's webhook is sent only labelled pods by default: set the label"},
	{Key: AnnotationLayout, Default: LayoutNative, Form: `"native" or "legacy"`,
		valid: func(v string) bool { return v == LayoutNative || v == LayoutLegacy },
		Usage: "native: the sidecar is an init container with restartPolicy Always (a native sidecar, on by default since Kubernetes 1.29); legacy: a plain container whose own preStop waits for the handover, for a platform that does not run native sidecars"},
	{Key: AnnotationContainer, Form: "the name of one of the pod's containers",
		Usage: "the worker container, which gets the preStop hook; without it, the first container"},
	{Key: AnnotationWrapPreStop, Default: "false", Form: `"true" or "false"`, valid: isBool,
		Usage: "when the worker container already has a preStop hook (exec or sleep), run it after the handover instead of refusing to inject"},
	{Key: AnnotationAllowSharedProcessNamespace, Default: "false", Form: `"true" or "false"`, valid: isBool,
		Usage: "inject a pod with `shareProcessNamespace: true`, which is refused without it: in a shared process namespace every container of the pod sees the sidecar and the worker and, running as the same user or with CAP_SYS_PTRACE, can read the pod's token and reach the control path through /proc/PID/root, so \"true\" trusts every container of the pod as the worker. `hostPID: true` is refused always"},
	{Key: AnnotationSidecarCPURequest, Default: "the injector's (chart: sidecar.resources)", Form: quantityForm, valid: isQuantity,
		Usage: "the CPU request of this pod's sidecar and its install step, in place of the injector's; at most its CPU limit"},
	{Key: AnnotationSidecarCPULimit, Default: "the injector's (chart: none)", Form: quantityForm, valid: isQuantity,
		Usage: "the CPU limit of this pod's sidecar and its install step; at least its CPU request"},
	{Key: AnnotationSidecarMemoryRequest, Default: "the injector's (chart: sidecar.resources)", Form: quantityForm, valid: isQuantity,
		Usage: "the memory request of this pod's sidecar and its install step, in place of the injector's; at most its memory limit (give both to raise the request past the injector's limit)"},
	{Key: AnnotationSidecarMemoryLimit, Default: "the injector's (chart: sidecar.resources)", Form: quantityForm, valid: isQuantity,
		Usage: "the memory limit of this pod's sidecar and its install step, in place of the injector's; at least its memory request. The sidecar sets its Go runtime's soft limit to 3/4 of it"},
	{Key: AnnotationStatus, Form: `"injected", set by handoff`, valid: func(v string) bool { return v == StatusInjected }, Mark: true,
		Usage: "marks an injected pod, which is then left alone; do not set it yourself. handoff also sets the label " + LabelInjected + ": \"true\" on it, by which the chart's NetworkPolicy selects it"},
	{Key: AnnotationVersion, Form: "a version, like v0.2.0, set by handoff", Mark: true,
		Usage: "the version of handoff that injected the pod: the webhook's (or `handoff inject`'s), and its sidecar's unless the injector was given another image. Injection replaces any value the pod had; elsewhere it is ignored. handoff also sets the label of the same key to the same version, so `kubectl get pods -A -l '" + LabelInjected + "," + LabelVersion + "!=v0.2.0'` lists the pods whose sidecars are not v0.2.0 (and those injected before this annotation existed); `handoff version` counts the pods per version"},
}

func isBool(v string) bool { return v == "true" || v == "false" }

// quantityForm is the accepted form of the sidecar resource annotations.
const quantityForm = "a Kubernetes quantity above 0, like `100m` or `0.5` (CPU), `64Mi` (memory)"

// isQuantity accepts a quantity above 0, as a container's resources take.
func isQuantity(v string) bool {
	q, err := resource.ParseQuantity(v)
	return err == nil && q.Sign() > 0
}

// resourceOverride is one sidecar resource annotation of a pod, checked.
type resourceOverride struct {
	limit bool // a limit, else a request
	name  corev1.ResourceName
	value resource.Quantity
}

// resourceAnnotations are the sidecar resource annotations, with what each sets.
var resourceAnnotations = []struct {
	key   string
	limit bool
	name  corev1.ResourceName
}{
	{AnnotationSidecarCPURequest, false, corev1.ResourceCPU},
	{AnnotationSidecarCPULimit, true, corev1.ResourceCPU},
	{AnnotationSidecarMemoryRequest, false, corev1.ResourceMemory},
	{AnnotationSidecarMemoryLimit, true, corev1.ResourceMemory},
}

// resourceOverrides reads a pod's sidecar resource annotations (their
// values are checked with Keys) and refuses a request above its limit once
// they replace the injector's defaults, which the API server would refuse
// with a message that names no annotation.
func resourceOverrides(a map[string]string, defaults corev1.ResourceRequirements) ([]resourceOverride, error) {
	var out []resourceOverride
	for _, r := range resourceAnnotations {
		v, ok := a[r.key]
		if !ok || !isQuantity(v) {
			continue
		}
		out = append(out, resourceOverride{limit: r.limit, name: r.name, value: resource.MustParse(v)})
	}
	got := applyResources(defaults, out)
	var errs []error
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := got.Requests[name]
		lim, hasLim := got.Limits[name]
		if !hasReq || !hasLim || req.Cmp(lim) <= 0 {
			continue
		}
		reqKey, limKey := AnnotationSidecarCPURequest, AnnotationSidecarCPULimit
		if name == corev1.ResourceMemory {
			reqKey, limKey = AnnotationSidecarMemoryRequest, AnnotationSidecarMemoryLimit
		}
		from := func(key string) string {
			if _, ok := a[key]; ok {
				return "annotation " + key
			}
			return "the injector's default (--" + strings.TrimPrefix(key, config.AnnotationPrefix) + ")"
		}
		errs = append(errs, refuse(ReasonInvalidAnnotation, fmt.Errorf("%s %s is above the %s limit %s of %s: want a request at most the limit; set %s too",
			from(reqKey), req.String(), name, lim.String(), from(limKey), limKey)))
	}
	return out, errors.Join(errs...)
}

// applyResources returns defaults with the overrides in place, on copies.
func applyResources(defaults corev1.ResourceRequirements, overrides []resourceOverride) corev1.ResourceRequirements {
	r := *defaults.DeepCopy()
	for _, o := range overrides {
		list := &r.Requests
		if o.limit {
			list = &r.Limits
		}
		if *list == nil {
			*list = corev1.ResourceList{}
		}
		(*list)[o.name] = o.value
	}
	return r
}

// resources are the sidecar's and the install step's resources: the
// injector's with the pod's annotations in place.
func (p *plan) resources(defaults corev1.ResourceRequirements) corev1.ResourceRequirements {
	if len(p.overrides) == 0 {
		return defaults
	}
	return applyResources(defaults, p.overrides)
}

// lookupKey returns the injection annotation with key k.
func lookupKey(k string) (Key, bool) {
	i := slices.IndexFunc(Keys, func(x Key) bool { return x.Key == k })
	if i < 0 {
		return Key{}, false
	}
	return Keys[i], true
}

// knownKeys lists every handoff.dev/ annotation key, for error messages.
func knownKeys() []string {
	var keys []string
	for _, k := range Keys {
		keys = append(keys, k.Key)
	}
	for _, d := range config.Table {
		if d.Annotation {
			keys = append(keys, d.AnnotationKey())
		}
	}
	return keys
}

// Markdown documents every handoff.dev/ annotation: the injection keys and
// the sidecar settings. docs/annotations.md is this text.
func Markdown() string {
	var b strings.Builder
	b.WriteString(`# Pod annotations

Generated from inject.Keys and config.Table by ` + "`go test ./inject -run TestAnnotationsDoc -update`" + `;
do not edit by hand.

Every key has the prefix ` + "`" + config.AnnotationPrefix + "`" + `. Put them on the pod template
(` + "`spec.template.metadata.annotations`" + ` of a Deployment, StatefulSet, ...).
The webhook, and ` + "`handoff inject`" + `, refuse a pod whose handoff annotations
are not valid, naming the annotation, the value and the accepted form. An
unknown key under the prefix is refused on any pod they see, even one that
does not ask for injection, so a misspelt key (` + "`handoff.dev/injct`" + `) is not lost.

## Which pods the webhook sees

A pod asks for the sidecar with the label ` + "`" + LabelInject + `: "true"` + "`" + ` or the annotation of
the same key. The API server selects the pods it sends to a webhook by label,
never by annotation, and the chart has it send only the pods that need the
webhook, so that no other pod waits on it, or, with ` + "`failurePolicy: Fail`" + `,
fails with it. Its ` + "`webhook.selectBy`" + `:

| value | the API server sends |
|---|---|
| ` + "`pod`" + ` (default) | pods labelled ` + "`" + LabelInject + `: "true"` + "`" + ` |
| ` + "`namespace`" + ` | every pod of a namespace labelled ` + "`" + LabelInject + `: "true"` + "`" + `, but pods labelled ` + "`\"false\"`" + ` |
| ` + "`podOrNamespace`" + ` | either (two webhook entries, as Istio's chart has) |

The trade-off: the webhook reads the annotations only of the pods it is sent.
With ` + "`selectBy: pod`" + `, a pod that has the annotation ` + "`" + AnnotationInject + `: "true"` + "`" + ` but not
the label is created without the sidecar, and a misspelt key (` + "`handoff.dev/injct`" + `,
or the label misspelt) on a pod without the label is not seen at all. With
` + "`selectBy: namespace`" + ` every pod of the labelled namespaces is checked as before,
at the cost of each of their pods waiting on the webhook. ` + "`handoff inject`" + `
reads every pod template it is given, labelled or not.

## Injection

| annotation | default | accepted | meaning |
|---|---|---|---|
`)
	for _, k := range Keys {
		if !k.Mark {
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.Key, orDash(k.Default), k.Form, k.Usage)
		}
	}
	b.WriteString(`
## Set by handoff

Injection writes these on every pod it injects; they record what was done and
configure nothing.

| annotation | value | meaning |
|---|---|---|
`)
	for _, k := range Keys {
		if k.Mark {
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", k.Key, k.Form, k.Usage)
		}
	}
	b.WriteString(`
## Sidecar settings

Each becomes the sidecar's environment variable of the same name
(` + "`" + config.EnvPrefix + "LEASE_DURATION`" + ` for ` + "`lease-duration`" + `). The grace period is read from
the pod's ` + "`terminationGracePeriodSeconds`" + `; the pod's name, namespace and UID
from the downward API.

| annotation | default | accepted | meaning |
|---|---|---|---|
`)
	for _, d := range config.Table {
		if d.Annotation {
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", d.AnnotationKey(), orDash(d.Default), d.Form, d.Usage)
		}
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return "`" + s + "`"
}
