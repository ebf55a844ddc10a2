// Package inject adds the handoff sidecar to a pod as its handoff.dev/
// annotations ask. The admission webhook and `handoff inject` both call Pod,
// so a pod looks the same whichever path injected it.
//
// An injected pod has:
//   - a volume handoff-bin (emptyDir) and an init container handoff-install
//     that copies the handoff binary into it and writes the pod's token
//     there (protocol.TokenFile), kept if already written;
//   - the sidecar container handoff: with the native layout an init
//     container with restartPolicy Always, started before the worker and
//     stopped after it; with the legacy layout a plain container whose own
//     preStop hook waits for the handover;
//   - a volume handoff-run (emptyDir in memory) for the sockets of the
//     control API (the sidecar's) and the app API (the worker's),
//     protocol.ControlSocket and protocol.AppSocket, mounted at
//     protocol.RunDir into the sidecar and the worker container alone;
//   - handoff-bin mounted read-only at BinDir into the sidecar, which
//     reads the token (HANDOFF_TOKEN_FILE), and its own memory limit in
//     HANDOFF_MEMORY_LIMIT (downward API), for the Go runtime's;
//   - the service account token in the sidecar alone: the pod gets
//     automountServiceAccountToken false, and the sidecar mounts a projected
//     token volume of its own (TokenVolume) where the kubelet would, unless
//     the pod sets automountServiceAccountToken true (see apiToken);
//   - on the worker container, handoff-bin mounted read-only at BinDir, a
//     preStop exec hook running `handoff prestop --addr ... --token-file
//     ...`, and HANDOFF_TOKEN_FILE, HANDOFF_APP_URL and
//     HANDOFF_LEASE_DURATION for package worker (the key its calls are
//     signed with, where to serve, the bound of a term);
//   - the annotation handoff.dev/status: injected and the label
//     handoff.dev/injected: "true" (LabelInjected); the annotation and the
//     label handoff.dev/version: the injector's version (AnnotationVersion,
//     LabelVersion).
package inject

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/internal/memlimit"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/version"
)

// Names and paths of what Pod adds.
const (
	SidecarName = "handoff"
	InstallName = "handoff-install"
	VolumeName  = "handoff-bin"
	// RunVolumeName is the volume of the sockets, mounted at
	// protocol.RunDir.
	RunVolumeName = "handoff-run"
	// BinDir is where the install step and the worker container mount the
	// volume with the handoff binary: a top-level directory, since the
	// handoff image's own /handoff is a file, not a directory.
	BinDir = "/handoff-bin"
	// ImageBinary is the handoff binary's path in the handoff image
	// (bin/handoff: the webhook and the CLI), where ko puts a main
	// package's binary (hack/release.sh); also its entrypoint.
	ImageBinary = "/ko-app/handoff"
	// SidecarBinary is the binary's path in the handoff-sidecar image, the
	// image of Options.Image: bin/handoff-sidecar (cmd/handoff-sidecar),
	// without the webhook and the injector, which the sidecar, the install
	// step and the sidecar's preStop hook run (a smaller resident memory;
	// docs/performance.md, Footprint). ko names a main package's binary
	// after its folder: /ko-app/handoff-sidecar.
	SidecarBinary = "/ko-app/handoff-sidecar"
	// MetricsPortName names the sidecar's metrics and probes port.
	MetricsPortName = "handoff-metrics"

	// DefaultUserID is the user and group the install step and the sidecar
	// run as unless Options say otherwise: the images' own (ko's nonroot).
	DefaultUserID = 65532
	// OmitID, as Options.RunAsUser or Options.RunAsGroup, leaves the id
	// out of the install step's and the sidecar's securityContext, for a
	// platform that assigns one to every container (OpenShift's
	// restricted-v2 SCC: a random user of the namespace's range, refusing
	// any other); runAsNonRoot stays.
	OmitID = -1
)

// defaultGracePeriod is the API's default terminationGracePeriodSeconds.
const defaultGracePeriod = 30

// Options are the injector's own settings, the same for every pod.
type Options struct {
	// Image is the handoff-sidecar image (a reference: repository:tag or
	// repository@sha256:…), for the sidecar and the install step; its
	// binary is at SidecarBinary.
	Image           string
	ImagePullPolicy corev1.PullPolicy
	// Resources of the sidecar and the install step; a pod's annotations
	// handoff.dev/sidecar-{cpu,memory}-{request,limit} replace one each.
	Resources corev1.ResourceRequirements
	// RunAsUser and RunAsGroup are the ids the install step and the sidecar
	// run as (their securityContext's runAsUser, runAsGroup): 0 means
	// DefaultUserID, OmitID leaves the field out (the platform's or the
	// image's then), any other value from 1 is that id. Root cannot be
	// asked for: runAsNonRoot is always true. The install step runs as the
	// worker's user instead when the pod names one (tokenFileAccess).
	RunAsUser, RunAsGroup int64
	// Version is the version of handoff written to every injected pod
	// (AnnotationVersion, LabelVersion), like v0.2.0; empty: this build's,
	// version.Get().
	Version string
}

// Result says what Pod did.
type Result string

// Results of Pod.
const (
	Injected        Result = "injected"
	Skipped         Result = "skipped"          // handoff.dev/inject absent or "false"
	AlreadyInjected Result = "already-injected" // handoff.dev/status is "injected"
)

// Pod injects the sidecar into the pod (or pod template) described by meta
// and spec, in place. It leaves them untouched and returns AlreadyInjected
// when handoff.dev/status is "injected", and Skipped when neither the label
// nor the annotation handoff.dev/inject is "true". Otherwise it checks every handoff.dev/ annotation
// and the pod itself first and, if anything is wrong, returns all the
// problems joined, each naming the annotation or field, the value and the
// accepted form, and changes nothing. It refuses a worker container that
// already has a preStop hook unless handoff.dev/wrap-prestop is "true" (or
// whose wrapped sleep hook is not from 0 to the grace period), a grace
// period, the pod's or the worker's liveness or startup probe's
// terminationGracePeriodSeconds, no longer than deadline-margin plus
// handback-reserve or above config.MaxGracePeriodSeconds, a hostNetwork pod, and a
// shard-peers selector that does not select the pod's own labels or that
// selects on pod-template-hash or controller-revision-hash. It refuses too a
// hostPID pod, a pod with shareProcessNamespace true unless
// handoff.dev/allow-shared-process-namespace is "true", and two containers
// of one name. Each problem is a *Refusal; Reasons lists their codes.
func Pod(meta *metav1.ObjectMeta, spec *corev1.PodSpec, o Options) (Result, error) {
	if o.Image == "" {
		return "", refuse(ReasonNoImage, errors.New("inject: no handoff image configured"))
	}
	a := meta.Annotations
	if res, err := wanted(meta.Labels, a); res != "" || err != nil {
		return res, err
	}
	p, err := newPlan(meta.Labels, a, spec, o.Resources)
	if err != nil {
		return "", err
	}
	p.apply(meta, spec, o)
	return Injected, nil
}

// wanted tells from a pod's labels and annotations whether it asks for
// injection: "" when the label or the annotation handoff.dev/inject is
// "true", AlreadyInjected or Skipped when it does not, or an error for a
// label or annotation handoff.dev/inject that is not "true" or "false", for
// a label and an annotation that disagree, or, on a pod that does not ask,
// for an unknown handoff.dev/ key (a misspelt handoff.dev/injct must not
// pass unnoticed).
func wanted(labels, a map[string]string) (Result, error) {
	if a[AnnotationStatus] == StatusInjected {
		return AlreadyInjected, nil
	}
	label, labelled := labels[LabelInject]
	annotation, annotated := a[AnnotationInject]
	var errs []error
	if labelled && !isBool(label) {
		errs = append(errs, refuse(ReasonInvalidLabel, fmt.Errorf("label %s: %q is not accepted; want \"true\" or \"false\"", LabelInject, label)))
	}
	if annotated && !isBool(annotation) {
		errs = append(errs, refuse(ReasonInvalidAnnotation, annotationError(AnnotationInject, annotation)))
	}
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}
	if labelled && annotated && label != annotation {
		return "", refuse(ReasonInvalidLabel, fmt.Errorf("label %s is %q but annotation %s is %q; set one, or both the same",
			LabelInject, label, AnnotationInject, annotation))
	}
	if label != "true" && annotation != "true" {
		if err := unknownKeys(a); err != nil {
			return "", err
		}
		return Skipped, nil
	}
	return "", nil
}

// plan is a checked injection, ready to apply.
type plan struct {
	settings *config.Settings
	env      []corev1.EnvVar // settings given by annotation
	worker   int             // index in spec.Containers
	// workerName is the worker container's name, for the sidecar to find its
	// probes' terminationGracePeriodSeconds.
	workerName string
	layout     string
	grace      int64
	hook       []string // the worker's preStop command
	// resources are the pod's handoff.dev/sidecar-* quantities, checked.
	overrides []resourceOverride
}

// newPlan checks the pod; defaults are the injector's sidecar resources
// (Options.Resources), which the pod's annotations may replace.
func newPlan(podLabels, a map[string]string, spec *corev1.PodSpec, defaults corev1.ResourceRequirements) (*plan, error) {
	var errs []error
	for _, key := range Keys {
		if v, ok := a[key.Key]; ok && key.valid != nil && !key.valid(v) {
			errs = append(errs, refuse(ReasonInvalidAnnotation, annotationError(key.Key, v)))
		}
	}
	errs = append(errs, unknownKeys(a))

	p := &plan{layout: LayoutNative, grace: defaultGracePeriod}
	overrides, err := resourceOverrides(a, defaults)
	p.overrides = overrides
	errs = append(errs, err)
	if v := a[AnnotationLayout]; v != "" {
		p.layout = v
	}
	if spec.TerminationGracePeriodSeconds != nil {
		p.grace = *spec.TerminationGracePeriodSeconds
	}
	s, err := config.Load(config.Annotations(a),
		// Stand-ins for what the sidecar reads from the downward API.
		config.Map(map[string]string{"pod-name": "pod", "pod-uid": "uid"}, "downward API"))
	if err != nil {
		errs = append(errs, refuse(ReasonInvalidAnnotation, namedAnnotations(err)))
	} else {
		p.settings = s
		errs = append(errs, p.gracePeriod("spec.terminationGracePeriodSeconds", p.grace))
	}
	for _, d := range config.Table {
		if v, ok := a[d.AnnotationKey()]; ok && d.Annotation {
			p.env = append(p.env, corev1.EnvVar{Name: d.Env(), Value: v})
		}
	}

	if p.settings != nil {
		errs = append(errs, p.checkPorts()...)
		errs = append(errs, shardPeers(podLabels, p.settings.ShardPeers, len(p.settings.Shards) > 0))
	}
	if spec.OS != nil && spec.OS.Name != corev1.Linux {
		errs = append(errs, refuse(ReasonOS, fmt.Errorf("spec.os.name %s: the handoff sidecar runs on Linux only", spec.OS.Name)))
	}
	errs = append(errs, hostNetwork(spec), hostPID(spec), shareProcessNamespace(spec, a[AnnotationAllowSharedProcessNamespace] == "true"),
		tokenConflicts(spec), duplicateNames(spec))
	p.worker, err = workerIndex(a[AnnotationContainer], spec)
	if err != nil {
		errs = append(errs, refuse(ReasonWorker, err))
	} else {
		p.workerName = spec.Containers[p.worker].Name
		if p.settings != nil {
			errs = append(errs, p.probeGracePeriods(spec.Containers[p.worker])...)
		}
		for _, m := range spec.Containers[p.worker].VolumeMounts {
			if path.Clean(m.MountPath) == BinDir {
				errs = append(errs, refuse(ReasonNameTaken, fmt.Errorf("spec.containers[%s].volumeMounts: %s is taken by volume %q; handoff mounts its binary there",
					spec.Containers[p.worker].Name, BinDir, m.Name)))
			}
			if path.Clean(m.MountPath) == protocol.RunDir {
				errs = append(errs, refuse(ReasonNameTaken, fmt.Errorf("spec.containers[%s].volumeMounts: %s is taken by volume %q; handoff mounts its sockets there",
					spec.Containers[p.worker].Name, protocol.RunDir, m.Name)))
			}
		}
	}
	errs = append(errs, conflicts(spec)...)
	if err == nil && p.settings != nil {
		p.hook, err = p.preStop(spec.Containers[p.worker], a[AnnotationWrapPreStop] == "true")
		errs = append(errs, refuse(ReasonPreStop, err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// gracePeriod refuses a grace period of seconds (the pod's or a probe's
// terminationGracePeriodSeconds, at field) that the sidecar cannot use: above
// config.MaxGracePeriodSeconds, the longest the kubelet and the sidecar can
// wait (the API takes any int64, and seconds * time.Second wraps above it),
// or no longer than deadline-margin plus handback-reserve, which leaves the
// handover no time. Needs p.settings.
func (p *plan) gracePeriod(field string, seconds int64) error {
	s := p.settings
	// Each at most config.MaxDuration (1h): the sum is at most 2h, no wrap.
	reserve := s.DeadlineMargin + s.HandbackReserve
	switch {
	case seconds > config.MaxGracePeriodSeconds:
		return refuse(ReasonGracePeriod, fmt.Errorf("%s %d: must be at most %d (%s), the longest grace period the kubelet and the sidecar can wait",
			field, seconds, config.MaxGracePeriodSeconds, config.MaxGracePeriod))
	// From 1 to MaxGracePeriodSeconds, seconds * time.Second does not wrap.
	case seconds <= 0 || time.Duration(seconds)*time.Second <= reserve:
		return refuse(ReasonGracePeriod, fmt.Errorf("%s %d: must be more than %s (%s) plus %s (%s), or the handover has no time; raise it or lower those",
			field, seconds, config.AnnotationPrefix+"deadline-margin", s.DeadlineMargin, config.AnnotationPrefix+"handback-reserve", s.HandbackReserve))
	}
	return nil
}

// probeGracePeriods refuses the worker's liveness or startup probe's
// terminationGracePeriodSeconds as gracePeriod does the pod's: the kubelet
// gives a kill by that probe this grace period instead of the pod's, and
// the sidecar takes the handover's deadline from it. (A readiness probe
// kills nothing; the API refuses the field there.)
func (p *plan) probeGracePeriods(w corev1.Container) []error {
	var errs []error
	for _, probe := range []struct {
		name  string
		probe *corev1.Probe
	}{{"livenessProbe", w.LivenessProbe}, {"startupProbe", w.StartupProbe}} {
		if probe.probe == nil || probe.probe.TerminationGracePeriodSeconds == nil {
			continue
		}
		field := fmt.Sprintf("spec.containers[%s].%s.terminationGracePeriodSeconds", w.Name, probe.name)
		errs = append(errs, p.gracePeriod(field, *probe.probe.TerminationGracePeriodSeconds))
	}
	return errs
}

// checkPorts refuses ports the injected pod cannot use: the preStop hook
// needs a fixed control port, and the sidecar's ports share the pod's
// network namespace. Only TCP addresses have ports: the control and app
// APIs are on sockets unless a pod opts into TCP.
func (p *plan) checkPorts() []error {
	var errs []error
	ports := map[int]string{}
	addrs := []struct{ setting, addr string }{{"metrics-addr", p.settings.MetricsAddr}}
	if p.settings.ControlAddr == p.settings.AppURL {
		errs = append(errs, fmt.Errorf("annotations %scontrol-addr and %sapp-url: both are %s; want distinct addresses", config.AnnotationPrefix, config.AnnotationPrefix, p.settings.AppURL))
	}
	for _, e := range []struct {
		setting string
		e       protocol.Endpoint
	}{{"control-addr", p.settings.ControlAddr}, {"app-url", p.settings.AppURL}} {
		if e.e.Network == "tcp" {
			addrs = append(addrs, struct{ setting, addr string }{e.setting, e.e.Address})
		} else if path.Dir(e.e.Address) != protocol.RunDir {
			errs = append(errs, fmt.Errorf("annotation %s: socket %s is not in %s, the volume that the sidecar and the worker container both mount; want a path like %s/NAME.sock",
				config.AnnotationPrefix+e.setting, e.e.Address, protocol.RunDir, protocol.RunDir))
		}
	}
	for _, x := range addrs {
		_, port, _ := net.SplitHostPort(x.addr) // checked by config
		n, _ := config.Port(port)
		key := config.AnnotationPrefix + x.setting
		switch {
		case n == 0:
			errs = append(errs, fmt.Errorf("annotation %s: port 0 is not accepted in a pod; want a fixed port", key))
		case ports[n] != "":
			errs = append(errs, fmt.Errorf("annotations %s and %s: both use port %d; want distinct ports", ports[n], key, n))
		default:
			ports[n] = key
		}
	}
	for i, err := range errs {
		errs[i] = refuse(ReasonPorts, err)
	}
	return errs
}

// hostNetwork refuses a pod in the node's network namespace: its loopback
// is the node's, so two such pods on one node would share the sidecar's
// control and app ports, and one pod's preStop hook could reach the other
// pod's sidecar and hand over the wrong worker.
func hostNetwork(spec *corev1.PodSpec) error {
	if !spec.HostNetwork {
		return nil
	}
	return refuse(ReasonHostNetwork, errors.New("spec.hostNetwork true: the pod's loopback is the node's, so two such pods on one node share the sidecar's control and app ports and one pod's preStop hook can reach the other pod's sidecar; handoff needs the pod's own network namespace (hostNetwork false)"))
}

// hostPID refuses a pod in the node's process namespace: there the pod's
// other containers and the node's processes see the sidecar's and the
// worker's processes, and any of them running as the same user (65532, the
// sidecar's, is the usual non-root one) or with CAP_SYS_PTRACE can open
// their files through /proc/PID/root: the pod's token in BinDir, and the
// control path.
func hostPID(spec *corev1.PodSpec) error {
	if !spec.HostPID {
		return nil
	}
	return refuse(ReasonHostPID, errors.New("spec.hostPID true: the pod's containers run in the node's process namespace, where the pod's other containers and the node's processes see the sidecar and the worker, and any of them running as the same user or with CAP_SYS_PTRACE can read the pod's token and reach the control path through /proc/PID/root; handoff needs the pod's own process namespace (hostPID false)"))
}

// shareProcessNamespace refuses a pod whose containers share one process
// namespace, unless allowed (AnnotationAllowSharedProcessNamespace "true"):
// there every container of the pod sees the sidecar's and the worker's
// processes and, running as the same user or with CAP_SYS_PTRACE, can read
// the pod's token and reach the control path through /proc/PID/root, which
// the volume mounted only into the sidecar and the worker is meant to keep
// from them. Allowing it trusts every container of the pod as the worker.
func shareProcessNamespace(spec *corev1.PodSpec, allowed bool) error {
	if spec.ShareProcessNamespace == nil || !*spec.ShareProcessNamespace || allowed {
		return nil
	}
	return refuse(ReasonShareProcessNamespace, fmt.Errorf("spec.shareProcessNamespace true: every container of the pod sees the sidecar and the worker, and any running as the same user or with CAP_SYS_PTRACE can read the pod's token and reach the control path through /proc/PID/root; remove the field, or set %s: \"true\" to inject anyway, trusting every container of the pod as the worker",
		AnnotationAllowSharedProcessNamespace))
}

// duplicateNames refuses two containers of one name, among the pod's
// containers, init containers and ephemeral containers: the API refuses
// such a pod, and handoff finds the worker by its name.
func duplicateNames(spec *corev1.PodSpec) error {
	var errs []error
	first := map[string]string{}
	check := func(field, name string) {
		if f, ok := first[name]; ok {
			errs = append(errs, fmt.Errorf("%s.name: %q is also the name of %s; container names are unique within a pod (the API refuses it, and handoff finds the worker by name); rename one", field, name, f))
			return
		}
		first[name] = field
	}
	for i, c := range spec.Containers {
		check(fmt.Sprintf("spec.containers[%d]", i), c.Name)
	}
	for i, c := range spec.InitContainers {
		check(fmt.Sprintf("spec.initContainers[%d]", i), c.Name)
	}
	for i, c := range spec.EphemeralContainers {
		check(fmt.Sprintf("spec.ephemeralContainers[%d]", i), c.Name)
	}
	return refuse(ReasonDuplicateContainerName, errors.Join(errs...))
}

// markInjected sets the annotation handoff.dev/status: injected, which
// makes Pod leave the pod alone from then on, and the label
// handoff.dev/injected: "true", by which a NetworkPolicy selects the pods
// that run the sidecar; and handoff.dev/version, the annotation and (when v
// is a valid label value) the label, to v, replacing what the pod had.
func markInjected(meta *metav1.ObjectMeta, v string) {
	if meta.Annotations == nil {
		meta.Annotations = map[string]string{}
	}
	meta.Annotations[AnnotationStatus] = StatusInjected
	meta.Annotations[AnnotationVersion] = v
	if meta.Labels == nil {
		meta.Labels = map[string]string{}
	}
	meta.Labels[LabelInjected] = "true"
	if len(validation.IsValidLabelValue(v)) == 0 {
		meta.Labels[LabelVersion] = v
	} else {
		delete(meta.Labels, LabelVersion)
	}
}

// revisionLabels are the labels a controller sets per revision of a
// workload's pod template: a shard-peers selector on one of them leaves the
// pods of the old and the new revision blind to each other in a rollout.
var revisionLabels = []string{"pod-template-hash", "controller-revision-hash"}

// shardPeers refuses a shard-peers selector (checked by config) that does
// not select the pod's own labels, since a pod counts itself up from the
// same watch and would never take a shard, or that selects on a label of
// one revision (revisionLabels). Nil without shards.
func shardPeers(podLabels map[string]string, selector string, shards bool) error {
	if !shards {
		return nil
	}
	key := config.AnnotationPrefix + "shard-peers"
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil // config has said so
	}
	reqs, _ := sel.Requirements()
	for _, r := range reqs {
		if slices.Contains(revisionLabels, r.Key()) {
			return refuse(ReasonInvalidAnnotation, fmt.Errorf("annotation %s: %q selects on %s, which differs per revision: in a rollout the old and new pods would not count each other; want a label selector on the workload's own labels, like app=orders",
				key, selector, r.Key()))
		}
	}
	if !sel.Matches(labels.Set(podLabels)) {
		return refuse(ReasonInvalidAnnotation, fmt.Errorf("annotation %s: %q does not select this pod's own labels (%s): the pod would never count itself up, and never take a shard; want a label selector that the workload's pods match, like app=orders",
			key, selector, labels.Set(podLabels)))
	}
	return nil
}

// unknownKeys refuses annotations under the handoff.dev/ prefix that are
// neither injection keys nor sidecar settings, listing the known ones once.
func unknownKeys(a map[string]string) error {
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(a)) {
		name, ours := strings.CutPrefix(k, config.AnnotationPrefix)
		if !ours {
			continue
		}
		if _, ok := lookupKey(k); ok {
			continue
		}
		if d, ok := config.Lookup(name); !ok || !d.Annotation {
			errs = append(errs, fmt.Errorf("annotation %s: not a handoff annotation", k))
		}
	}
	if len(errs) > 0 {
		errs = append(errs, fmt.Errorf("the handoff annotations are %s", strings.Join(knownKeys(), ", ")))
	}
	return refuse(ReasonUnknownAnnotation, errors.Join(errs...))
}

// namedAnnotations makes each setting error of config.Load name the
// annotation it is about.
func namedAnnotations(err error) error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return err
	}
	var out []error
	for _, e := range joined.Unwrap() {
		var ce *config.Error
		if errors.As(e, &ce) {
			key := config.AnnotationPrefix + ce.Setting
			if d, ok := config.Lookup(ce.Setting); ok && d.Annotation && !strings.Contains(e.Error(), key) {
				e = relationError{key: key, err: ce}
			}
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}

// relationError is a setting's error (a relation between settings, which
// names no origin) said of the annotation that carries it, without naming
// the setting twice.
type relationError struct {
	key string
	err *config.Error
}

func (a relationError) Error() string {
	return fmt.Sprintf("annotation %s: %s; want %s", a.key, a.err.Reason, a.err.Form)
}

func (a relationError) Unwrap() error { return a.err }

// AcceptedForm is the accepted form of the handoff annotation k, "" for
// an unknown key.
func AcceptedForm(k string) string {
	if key, ok := lookupKey(k); ok {
		return key.Form
	}
	if d, ok := config.Lookup(strings.TrimPrefix(k, config.AnnotationPrefix)); ok && d.Annotation {
		return d.Form
	}
	return ""
}

func annotationError(k, v string) error {
	key, _ := lookupKey(k)
	return fmt.Errorf("annotation %s: %q is not accepted; want %s", k, v, key.Form)
}

func workerIndex(name string, spec *corev1.PodSpec) (int, error) {
	if len(spec.Containers) == 0 {
		return 0, errors.New("spec.containers: the pod has no container to hand over from")
	}
	if name == "" {
		return 0, nil
	}
	var names []string
	for i, c := range spec.Containers {
		if c.Name == name {
			return i, nil
		}
		names = append(names, c.Name)
	}
	return 0, fmt.Errorf("annotation %s: %q is not accepted; want the name of one of the pod's containers: %s",
		AnnotationContainer, name, strings.Join(names, ", "))
}

// conflicts reports names Pod would add that the pod already uses.
func conflicts(spec *corev1.PodSpec) []error {
	var errs []error
	for _, list := range []struct {
		field      string
		containers []corev1.Container
	}{{"spec.containers", spec.Containers}, {"spec.initContainers", spec.InitContainers}} {
		for _, c := range list.containers {
			if c.Name == SidecarName || c.Name == InstallName {
				errs = append(errs, refuse(ReasonNameTaken, fmt.Errorf("%s: the pod already has a container named %q, and %s is not %q; rename it",
					list.field, c.Name, AnnotationStatus, StatusInjected)))
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.Name == VolumeName || v.Name == RunVolumeName {
			errs = append(errs, refuse(ReasonNameTaken, fmt.Errorf("spec.volumes: the pod already has a volume named %q; rename it", v.Name)))
		}
	}
	return append(errs, mountsOfOurs(spec)...)
}

// mountsOfOurs refuses a container of the pod that already mounts a volume
// by the name of one injection adds (handoff-bin, handoff-run,
// handoff-api-token): the pod alone is invalid, but injected it would be
// admitted, and that container would hold the pod's token, the sockets or
// the sidecar's API token, which injection mounts into the sidecar and the
// worker alone; an init container mounting handoff-bin could even write a
// token of its choice before the install step, which keeps a token already
// there. Ephemeral containers are added after admission (their
// subresource is not sent to the webhook): docs/security.md.
func mountsOfOurs(spec *corev1.PodSpec) []error {
	ours := []string{VolumeName, RunVolumeName, TokenVolumeName}
	var errs []error
	for _, list := range []struct {
		field      string
		containers []corev1.Container
	}{{"spec.containers", spec.Containers}, {"spec.initContainers", spec.InitContainers}} {
		for _, c := range list.containers {
			for _, m := range c.VolumeMounts {
				if slices.Contains(ours, m.Name) {
					errs = append(errs, refuse(ReasonNameTaken, fmt.Errorf("%s[%s].volumeMounts: mounts volume %q, a name handoff's injection takes: it mounts that volume into the sidecar and the worker container alone (the pod's token, the sockets, the sidecar's API token); remove the mount",
						list.field, c.Name, m.Name)))
				}
			}
		}
	}
	return errs
}

// preStop is the worker's hook command: handoff prestop, then the hook the
// container had, when asked to wrap it.
func (p *plan) preStop(w corev1.Container, wrap bool) ([]string, error) {
	hook := []string{BinDir + "/handoff", "prestop", "--addr", p.settings.ControlAddr.String(), "--timeout", fmt.Sprintf("%ds", p.grace), "--token-file", protocol.TokenFile}
	if w.Lifecycle == nil || w.Lifecycle.PreStop == nil {
		return hook, nil
	}
	had := w.Lifecycle.PreStop
	switch {
	case !wrap:
		return nil, fmt.Errorf("spec.containers[%s].lifecycle.preStop: the worker container already has a preStop hook; set %s: \"true\" to run it after the handover",
			w.Name, AnnotationWrapPreStop)
	case had.Exec != nil:
		return append(append(hook, "--"), had.Exec.Command...), nil
	case had.Sleep != nil:
		// As the API requires of a sleep hook, which it no longer sees once
		// injected: from 0 to the grace period (so --then-sleep parses).
		if had.Sleep.Seconds < 0 || had.Sleep.Seconds > p.grace {
			return nil, fmt.Errorf("spec.containers[%s].lifecycle.preStop.sleep.seconds %d: must be from 0 to the pod's terminationGracePeriodSeconds (%d), as Kubernetes requires of a sleep hook",
				w.Name, had.Sleep.Seconds, p.grace)
		}
		return append(hook, "--then-sleep", fmt.Sprintf("%ds", had.Sleep.Seconds)), nil
	}
	return nil, fmt.Errorf("spec.containers[%s].lifecycle.preStop: only exec and sleep hooks can be wrapped, and this one is neither; remove it or make it an exec hook",
		w.Name)
}

func (p *plan) apply(meta *metav1.ObjectMeta, spec *corev1.PodSpec, o Options) {
	v := o.Version
	if v == "" {
		v = version.Get()
	}
	markInjected(meta, v)

	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: VolumeName, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("64Mi"))}}},
		// Two sockets: nothing is written there but their inodes.
		corev1.Volume{Name: RunVolumeName, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse("1Mi"))}}})
	resources := p.resources(o.Resources)
	owner, mode := tokenFileAccess(spec, spec.Containers[p.worker], id(o.RunAsUser))
	install := corev1.Container{
		Name: InstallName, Image: o.Image, ImagePullPolicy: o.ImagePullPolicy,
		Command:         []string{SidecarBinary},
		Args:            []string{"install", BinDir + "/handoff", "--token-file", protocol.TokenFile, "--token-mode", mode},
		VolumeMounts:    []corev1.VolumeMount{{Name: VolumeName, MountPath: BinDir}},
		Resources:       resources,
		SecurityContext: securityContext(o),
	}
	// The token file's owner: the worker's user where known.
	install.SecurityContext.RunAsUser = owner
	sidecar := p.sidecar(o, resources)
	apiToken(spec, &sidecar)
	spec.InitContainers = append(spec.InitContainers, install)
	if p.layout == LayoutLegacy {
		sidecar.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
			Command: []string{SidecarBinary, "prestop", "--addr", p.settings.ControlAddr.String(), "--timeout", fmt.Sprintf("%ds", p.grace), "--token-file", protocol.TokenFile}}}}
		spec.Containers = append(spec.Containers, sidecar)
	} else {
		sidecar.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
		sidecar.StartupProbe = p.probe("/readyz", 1, 60)
		spec.InitContainers = append(spec.InitContainers, sidecar)
	}

	w := &spec.Containers[p.worker]
	w.VolumeMounts = append(w.VolumeMounts, corev1.VolumeMount{Name: VolumeName, MountPath: BinDir, ReadOnly: true},
		corev1.VolumeMount{Name: RunVolumeName, MountPath: protocol.RunDir})
	// For package worker: the key of the sidecar's signed calls, where to
	// serve them, and the lease duration that bounds any term it grants.
	w.Env = append(w.Env,
		corev1.EnvVar{Name: protocol.TokenFileEnv, Value: protocol.TokenFile},
		corev1.EnvVar{Name: protocol.AppURLEnv, Value: p.settings.AppURL.String()},
		corev1.EnvVar{Name: protocol.LeaseDurationEnv, Value: p.settings.LeaseDuration.String()})
	if len(p.settings.Shards) > 0 {
		// The shard set, so the app knows which shards to try to lead.
		w.Env = append(w.Env, corev1.EnvVar{Name: protocol.ShardsEnv, Value: strings.Join(p.settings.Shards, ",")})
	}
	if w.Lifecycle == nil {
		w.Lifecycle = &corev1.Lifecycle{}
	}
	w.Lifecycle.PreStop = &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: p.hook}}
}

func (p *plan) sidecar(o Options, resources corev1.ResourceRequirements) corev1.Container {
	fromPod := func(name, path string) corev1.EnvVar {
		d, _ := config.Lookup(name)
		return corev1.EnvVar{Name: d.Env(), ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	grace, _ := config.Lookup("grace-period")
	workerContainer, _ := config.Lookup("worker-container")
	tokenFile, _ := config.Lookup("token-file")
	env := []corev1.EnvVar{
		fromPod("pod-name", "metadata.name"),
		fromPod("pod-namespace", "metadata.namespace"),
		fromPod("pod-uid", "metadata.uid"),
		{Name: grace.Env(), Value: fmt.Sprintf("%ds", p.grace)},
		{Name: workerContainer.Env(), Value: p.workerName},
		{Name: tokenFile.Env(), Value: protocol.TokenFile},
		memoryLimitEnv(),
	}
	c := corev1.Container{
		Name: SidecarName, Image: o.Image, ImagePullPolicy: o.ImagePullPolicy,
		Command:         []string{SidecarBinary},
		Args:            []string{"sidecar"},
		Env:             append(env, p.env...),
		VolumeMounts:    []corev1.VolumeMount{{Name: VolumeName, MountPath: BinDir, ReadOnly: true}, {Name: RunVolumeName, MountPath: protocol.RunDir}},
		Resources:       resources,
		SecurityContext: securityContext(o),
	}
	if port, ok := p.metricsPort(); ok {
		c.Ports = []corev1.ContainerPort{{Name: MetricsPortName, ContainerPort: port, Protocol: corev1.ProtocolTCP}}
		c.ReadinessProbe = p.probe("/readyz", 5, 3)
		c.LivenessProbe = p.probe("/healthz", 10, 3)
	}
	return c
}

// memoryLimitEnv gives the sidecar its own container's memory limit, in
// bytes (the downward API's limits.memory; the node's allocatable memory
// when the container has no limit), from which it sets the Go runtime's
// soft limit (internal/memlimit: 3/4 of it, unless GOMEMLIMIT is set).
func memoryLimitEnv() corev1.EnvVar {
	return corev1.EnvVar{Name: memlimit.EnvVar, ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
		Resource: "limits.memory", Divisor: resource.MustParse("1")}}}
}

// metricsPort is the port of metrics-addr when the kubelet can reach it
// (any interface), for the port entry and the probes.
func (p *plan) metricsPort() (int32, bool) {
	host, port, err := net.SplitHostPort(p.settings.MetricsAddr)
	anyInterface := host == "" || host == "0.0.0.0" || host == "::"
	if err != nil || !anyInterface {
		return 0, false
	}
	n, err := strconv.ParseInt(port, 10, 32)
	return int32(n), err == nil && n > 0
}

func (p *plan) probe(path string, period, failures int32) *corev1.Probe {
	if _, ok := p.metricsPort(); !ok {
		return nil
	}
	return &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString(MetricsPortName)}},
		PeriodSeconds:    period,
		FailureThreshold: failures,
	}
}

// securityContext is the install step's and the sidecar's: non-root, as
// user and group o.RunAsUser and o.RunAsGroup (id), no privilege.
func securityContext(o Options) *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot:             ptr.To(true),
		RunAsUser:                id(o.RunAsUser),
		RunAsGroup:               id(o.RunAsGroup),
		ReadOnlyRootFilesystem:   ptr.To(true),
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// id is an Options id as a securityContext field: nil for OmitID,
// DefaultUserID for 0.
func id(v int64) *int64 {
	switch {
	case v == OmitID:
		return nil
	case v <= 0:
		return ptr.To[int64](DefaultUserID)
	}
	return ptr.To(v)
}
