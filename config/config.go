// Package config holds handoff's settings: one table that gives every
// setting its name, default, accepted form and validation, and maps it onto
// command-line flags, HANDOFF_* environment variables and handoff.dev/ pod
// annotations. Every other package reads a validated Settings value.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/handoff-dev/handoff/protocol"
)

// AnnotationPrefix is the prefix of every pod annotation handoff reads.
const AnnotationPrefix = "handoff.dev/"

// EnvPrefix is the prefix of every environment variable handoff reads.
const EnvPrefix = "HANDOFF_"

// Bounds of the duration settings. Every duration has one, so that neither
// a value nor a sum or difference the sidecar makes of two of them
// (deadline-margin plus handback-reserve, the grace period minus
// deadline-margin) can wrap around.
const (
	// MaxDuration is the longest renew-deadline, retry-period,
	// deadline-margin and handback-reserve: 1h, as lease-duration
	// (protocol.MaxLeaseDuration). Two of them sum to at most 2h.
	MaxDuration = time.Hour
	// MaxGracePeriodSeconds is the longest grace period, in seconds, the
	// sidecar and the kubelet can wait: the whole seconds a time.Duration
	// holds (9223372036 s, about 292 years). The API accepts any int64 in a
	// pod's or a probe's terminationGracePeriodSeconds, but the kubelet
	// waits for a preStop hook with time.Duration(seconds) * time.Second,
	// which wraps above this.
	MaxGracePeriodSeconds = math.MaxInt64 / int64(time.Second)
	// MaxGracePeriod is MaxGracePeriodSeconds as a duration,
	// 2562047h47m16s: the longest grace-period.
	MaxGracePeriod = time.Duration(MaxGracePeriodSeconds) * time.Second
)

// Fallback is what the sidecar does with claims still unfinished when the
// drain deadline passes.
type Fallback string

const (
	// FallbackReturn asks the app to hand back every unfinished claim now.
	FallbackReturn Fallback = "return"
	// FallbackCancel asks the app to cancel in-flight work cooperatively, then hand it back.
	FallbackCancel Fallback = "cancel"
	// FallbackAbandon leaves unfinished claims to the queue's visibility timeout.
	FallbackAbandon Fallback = "abandon"
)

// LogLevel is the least level of the sidecar's log lines.
type LogLevel string

const (
	// LogLevelError logs errors only.
	LogLevelError LogLevel = "error"
	// LogLevelInfo logs every step, Lease change and Event (logr's V(0))
	// and errors: the default.
	LogLevelInfo LogLevel = "info"
	// LogLevelDebug adds the debug lines (logr's V(1)): each failed call to
	// the app, each drain poll that failed.
	LogLevelDebug LogLevel = "debug"
)

// Settings is the sidecar's validated configuration. Durations are
// time.Duration values parsed from Go duration strings ("15s", "1m30s"),
// each within its bounds: at most MaxDuration (1h), the grace period at most
// MaxGracePeriod.
type Settings struct {
	// PodName, PodNamespace and PodUID identify the pod the sidecar runs in
	// (downward API). The Lease holder identity is PodName + "_" + PodUID.
	PodName      string
	PodNamespace string
	PodUID       string
	// WorkerContainer is the name of the worker container, whose liveness
	// and startup probes' terminationGracePeriodSeconds give the deadline of
	// a probe kill; empty: unknown (the pod's grace period applies).
	WorkerContainer string

	// Leases are the names of the Leases this pod competes for, in
	// PodNamespace. Empty: the pod gets the drain sequence and no Lease.
	Leases []string
	// RoleLeases are the Leases, of Leases, that guard a role (a scheduled
	// or singleton job) rather than a partition of the work: the shutdown
	// sequence revokes and releases them as soon as it starts, right after
	// stop-claiming, instead of after the drain. IsRole tells them apart.
	RoleLeases []string
	// Shards are the Lease names of the pod's shard set, in PodNamespace:
	// partition Leases shared out among the peers that are up (package
	// shard; docs/shards.md), disjoint from Leases. Empty: no shard set.
	Shards []string
	// ShardPeers selects the pods that share the shard set (a label
	// selector, in PodNamespace); required with Shards.
	ShardPeers string
	// LeaseDuration is how long a standby waits after the last observed
	// renewal before it takes the Lease; RenewDeadline is how long the holder
	// keeps retrying a renewal before it gives leadership up; RetryPeriod is
	// the interval between attempts. Same meaning as client-go's. Each is at
	// most 1h (protocol.MaxLeaseDuration, MaxDuration).
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration

	// GracePeriod is the pod's terminationGracePeriodSeconds, used when the
	// Pod's metadata.deletionTimestamp cannot be read: from 1s to
	// MaxGracePeriod.
	GracePeriod time.Duration
	// DeadlineMargin is how long before the deletion deadline the sequence
	// must be over, left for the worker to exit after SIGTERM: from 0 to
	// MaxDuration.
	DeadlineMargin time.Duration
	// HandbackReserve is the part of the time before the deadline kept from
	// the drain wait for the fallback, the leadership revoke and the release:
	// from 0 to MaxDuration, so DeadlineMargin + HandbackReserve is at most
	// 2h and cannot overflow.
	HandbackReserve time.Duration
	// Fallback is the policy for claims still unfinished at the drain deadline.
	Fallback Fallback

	// ControlAddr is where the control API (preStop) listens: the control
	// socket, or by opt-in a loopback TCP address.
	ControlAddr protocol.Endpoint
	// MetricsAddr is the host:port of the read-only metrics and probes.
	MetricsAddr string
	// AppURL is where the app serves its side of the protocol: the app
	// socket, or by opt-in a loopback TCP address.
	AppURL protocol.Endpoint
	// Kubeconfig is a kubeconfig path; empty means in-cluster configuration.
	Kubeconfig string
	// TokenFile is the file with the pod's token (protocol.TokenFile in an
	// injected pod), required by `handoff sidecar`: the control API and the
	// app accept only calls that carry it.
	TokenFile string
	// LogLevel is the least level logged: error, info or debug.
	LogLevel LogLevel
	// MetricsLinger is deprecated and ignored: the sidecar no longer waits,
	// after its sequence, for a scrape of its metrics (the webhook counts
	// each sequence's outcome from its ShutdownFinished Event). It is still
	// parsed, from 0 to MaxMetricsLinger, so that pods and manifests that
	// set it stay valid; a later release removes it.
	MetricsLinger time.Duration
	// DeletionCost says the sidecar keeps its pod's pod-deletion-cost
	// annotation (corev1.PodDeletionCost) current while the pod runs, so
	// that a scale-in deletes idle pods first and Lease holders and pods
	// with long work in progress last (sidecar.DeletionCost ranks them).
	// Off by default: each change is a write of the pod, read by every
	// watcher of pods (docs/performance.md gives the rate).
	DeletionCost bool
	// PreferSuccessor says a release names the Lease's successor (a pod
	// that stays, picked at the shutdown's start), which the other
	// standbys let take the Lease first (leaderelection.AnnotationSuccessor).
	PreferSuccessor bool
}

// MaxMetricsLinger is the longest metrics-linger accepted (deprecated,
// ignored: Settings.MetricsLinger).
const MaxMetricsLinger = 2 * time.Minute

// Identity returns the Lease holder identity: pod name and pod UID, so that
// a replacement pod with the same name is never taken for the old holder.
func (s *Settings) Identity() string { return s.PodName + "_" + s.PodUID }

// IsRole reports whether Lease name guards a role (it is in RoleLeases);
// every other Lease guards a partition of the work, the safe default: a
// partition released before the drain lets a successor claim work this pod
// still does, a role released after it only costs time.
func (s *Settings) IsRole(name string) bool {
	for _, r := range s.RoleLeases {
		if r == name {
			return true
		}
	}
	return false
}

// Setting describes one configurable value. Name is the flag name; the
// environment variable is EnvPrefix + upper-snake Name, and, where
// Annotation is true, the pod annotation is AnnotationPrefix + Name.
type Setting struct {
	Name       string
	Default    string
	Form       string // the accepted form, quoted in errors and docs
	Usage      string
	Annotation bool
	set        func(s *Settings, v string) error
}

// Check reports whether v, from origin (like "flag --addr"), is an accepted
// value of the setting on its own, with the *Error that Load gives for it
// (the setting, the origin, the value and the accepted form); nil if it is.
// The relations between settings (validate) are not checked.
func (d Setting) Check(v, origin string) error {
	if err := d.set(&Settings{}, v); err != nil {
		return &Error{Setting: d.Name, Origin: origin, Value: v, Form: d.Form, Reason: err.Error()}
	}
	return nil
}

// RequiredForm is Form without its ", or empty": the accepted form where
// a relation with another setting requires a value.
func (d Setting) RequiredForm() string {
	return strings.TrimSuffix(d.Form, ", or empty")
}

// Env is the environment variable that carries this setting.
func (d Setting) Env() string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(d.Name, "-", "_"))
}

// AnnotationKey is the pod annotation that carries this setting, or "" if
// the setting is not set by annotation.
func (d Setting) AnnotationKey() string {
	if !d.Annotation {
		return ""
	}
	return AnnotationPrefix + d.Name
}

// Table lists every setting, in documentation order. It is the one source
// of truth for defaults and validation.
var Table = []Setting{
	{Name: "pod-name", Form: "a pod name", Usage: "name of this pod (downward API metadata.name)",
		set: func(s *Settings, v string) error { s.PodName = v; return nil }},
	{Name: "pod-namespace", Form: "a namespace name", Usage: "namespace of this pod (downward API metadata.namespace)",
		set: func(s *Settings, v string) error { s.PodNamespace = v; return nil }},
	{Name: "pod-uid", Form: "a UID", Usage: "UID of this pod (downward API metadata.uid)",
		set: func(s *Settings, v string) error { s.PodUID = v; return nil }},
	{Name: "worker-container", Form: "a container name (DNS label), or empty",
		Usage: "name of the worker container, whose probes' terminationGracePeriodSeconds give a probe kill's deadline (set by injection)",
		set:   setWorkerContainer},
	{Name: "leases", Form: "comma-separated Lease names (DNS subdomains), or empty", Annotation: true,
		Usage: "Leases this pod competes for, in its namespace",
		set:   setLeases},
	{Name: "role-leases", Form: "comma-separated names from leases, or empty", Annotation: true,
		Usage: "Leases that guard a role (a scheduled or singleton job, whose leader work the worker can stop at once): revoked and released as soon as the shutdown starts, right after stop-claiming. Every other Lease guards a partition of the work (the worker's claims come from it) and is released after the drain; that is the default, as a partition released early would let a successor claim work this pod still does, while a role released late only costs time",
		set:   setRoleLeases},
	{Name: "shards", Form: "comma-separated Lease names (DNS subdomains), or PREFIX{0..K} for PREFIX0 to PREFIXK like orders-{0..11}, or empty", Annotation: true,
		Usage: "the shard set: partition Leases shared out among the pods that shard-peers selects, each pod assigned at most ceil(N/M) of the N for the M pods up and Ready (it may hold one more for a moment while it sheds one); a shard shed or left is released only after the app stopped its work (docs/shards.md). Distinct from leases",
		set:   setShards},
	{Name: "shard-peers", Form: "a label selector, like app=orders, or empty", Annotation: true,
		Usage: "label selector of the pods that share the shard set, in this pod's namespace (every revision of the workload: not pod-template-hash); required with shards",
		set:   setShardPeers},
	{Name: "lease-duration", Default: "15s", Form: "a duration of at least 2s and at most 1h, like 15s", Annotation: true,
		Usage: "how long a standby waits after the last renewal it saw before taking the Lease",
		set:   duration(func(s *Settings) *time.Duration { return &s.LeaseDuration }, 2*time.Second, protocol.MaxLeaseDuration)},
	{Name: "renew-deadline", Default: "10s", Form: "a duration shorter than lease-duration, at most 1h, like 10s", Annotation: true,
		Usage: "how long the holder retries a renewal before it gives leadership up",
		set:   duration(func(s *Settings) *time.Duration { return &s.RenewDeadline }, time.Millisecond, MaxDuration)},
	{Name: "retry-period", Default: "2s", Form: "a duration under renew-deadline/1.2, at most 1h, like 2s", Annotation: true,
		Usage: "interval between attempts to acquire or renew",
		set:   duration(func(s *Settings) *time.Duration { return &s.RetryPeriod }, time.Millisecond, MaxDuration)},
	{Name: "grace-period", Default: "30s", Form: "a duration of at least 1s and at most 2562047h47m16s (9223372036s, the longest the kubelet waits), like 30s (the pod's terminationGracePeriodSeconds)",
		Usage: "termination grace period, used when the Pod's deletionTimestamp cannot be read",
		set:   duration(func(s *Settings) *time.Duration { return &s.GracePeriod }, time.Second, MaxGracePeriod)},
	{Name: "deadline-margin", Default: "2s", Form: "a duration from 0s to 1h, like 2s", Annotation: true,
		Usage: "the sequence ends this long before the pod's deletion deadline",
		set:   duration(func(s *Settings) *time.Duration { return &s.DeadlineMargin }, 0, MaxDuration)},
	{Name: "handback-reserve", Default: "2s", Form: "a duration from 0s to 1h, like 2s", Annotation: true,
		Usage: "time kept from the drain wait for the fallback, the leadership revoke and the Lease release",
		set:   duration(func(s *Settings) *time.Duration { return &s.HandbackReserve }, 0, MaxDuration)},
	{Name: "fallback", Default: string(FallbackReturn), Form: "one of return, cancel, abandon", Annotation: true,
		Usage: "what happens to unfinished claims at the drain deadline",
		set:   setFallback},
	{Name: "control-addr", Default: "unix://" + protocol.ControlSocket, Form: "unix:// and an absolute socket path, like unix://" + protocol.ControlSocket + ", or a loopback host:port, like 127.0.0.1:7450 (TCP: docs/protocol.md, Transport)", Annotation: true,
		Usage: "address of the control API (preStop, status): a Unix socket in the handoff-run volume, or by opt-in a loopback TCP address",
		set:   setControlAddr},
	{Name: "metrics-addr", Default: ":7451", Form: "a host:port, like :7451", Annotation: true,
		Usage: "address of the read-only metrics, /healthz and /readyz",
		set:   setMetricsAddr},
	{Name: "app-url", Default: "unix://" + protocol.AppSocket, Form: "unix:// and an absolute socket path, like unix://" + protocol.AppSocket + ", or an http URL on loopback with no path, query or fragment, like http://127.0.0.1:7452 (TCP: docs/protocol.md, Transport)", Annotation: true,
		Usage: "address of the app's side of the handoff protocol: a Unix socket in the handoff-run volume, or by opt-in a loopback TCP address",
		set:   setAppURL},
	{Name: "kubeconfig", Form: "a file path, or empty for in-cluster configuration",
		Usage: "kubeconfig file; empty means in-cluster configuration",
		set:   func(s *Settings, v string) error { s.Kubeconfig = v; return nil }},
	{Name: "token-file", Form: "the path of the pod's token file, like " + protocol.TokenFile,
		Usage: "file with the pod's token, the key that signs every call of the control API and to the app (never sent; set by injection; handoff install --token-file writes one)",
		set:   func(s *Settings, v string) error { s.TokenFile = v; return nil }},
	{Name: "log-level", Default: string(LogLevelInfo), Form: "one of error, info, debug", Annotation: true,
		Usage: "least level logged: error, info (every step, Lease change and Event), or debug (also each failed call to the app)",
		set:   setLogLevel},
	{Name: "metrics-linger", Default: "0s", Form: "a duration from 0s to 2m, like 45s", Annotation: true,
		Usage: "deprecated, ignored (a later release removes it): the sidecar no longer waits at exit for a scrape of its counts; the webhook counts each shutdown's outcome from its ShutdownFinished Event (handoff_handovers_total)",
		set:   duration(func(s *Settings) *time.Duration { return &s.MetricsLinger }, 0, MaxMetricsLinger)},
	{Name: "deletion-cost", Default: "false", Form: "true or false", Annotation: true,
		Usage: "keep the pod's controller.kubernetes.io/pod-deletion-cost current, so that a ReplicaSet scaling in deletes idle pods first and pods holding role Leases, partitions or long work in progress last (docs/scale-in.md); takes effect only on a pod annotated handoff.dev/deletion-cost: \"true\" (the chart's admission policy refuses the write elsewhere); each change is a patch of the pod's status, a lower cost only once it has lasted 20s, at most 3 at once and 1 per 10s sustained",
		set:   setBool(func(s *Settings) *bool { return &s.DeletionCost })},
	{Name: "prefer-successor", Default: "true", Form: "true or false", Annotation: true,
		Usage: "at the shutdown's start, pick for each Lease the pod holds (not the shards: their assignment picks) a successor among the other pods that compete for it, Ready and not being deleted, another revision than this pod's first and then the newest (one watch-list of the namespace's injected pods, from the apiserver's cache, started at the trigger; a release waits for it until 250 ms after the trigger at most); its release names it (Lease annotation handoff.dev/successor) and the other standbys hold back 500 ms so that it takes the Lease first: one move per rolling update, not one per old pod (docs/architecture.md, Leadership); false: every standby competes at once",
		set:   setBool(func(s *Settings) *bool { return &s.PreferSuccessor })},
}

// Lookup returns the setting named name.
func Lookup(name string) (Setting, bool) {
	for _, d := range Table {
		if d.Name == name {
			return d, true
		}
	}
	return Setting{}, false
}

// Source yields a value for a setting, and says where it came from (for
// instance "flag --lease-duration" or "annotation handoff.dev/fallback").
type Source func(d Setting) (value, origin string, ok bool)

// Load builds Settings from the first source that has each setting, falling
// back to the default. It returns every invalid value in one error, each
// naming its origin, the value and the accepted form.
func Load(sources ...Source) (*Settings, error) {
	s := &Settings{}
	var errs []error
	invalid := map[string]bool{}
	for _, d := range Table {
		v, origin := d.Default, "default"
		for _, src := range sources {
			if sv, so, ok := src(d); ok {
				v, origin = sv, so
				break
			}
		}
		if err := d.set(s, v); err != nil {
			errs = append(errs, &Error{Setting: d.Name, Origin: origin, Value: v, Form: d.Form, Reason: err.Error()})
			invalid[d.Name] = true
		}
	}
	errs = append(errs, s.validate(invalid)...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// Map is a Source over explicit values keyed by setting name.
func Map(values map[string]string, origin string) Source {
	return func(d Setting) (string, string, bool) {
		v, ok := values[d.Name]
		return v, origin, ok
	}
}

// Flags registers every setting on fs and returns a Source that yields the
// flags set on the command line.
func Flags(fs *pflag.FlagSet) Source {
	for _, d := range Table {
		fs.String(d.Name, d.Default, fmt.Sprintf("%s (env %s)", d.Usage, d.Env()))
	}
	return func(d Setting) (string, string, bool) {
		f := fs.Lookup(d.Name)
		if f == nil || !f.Changed {
			return "", "", false
		}
		return f.Value.String(), "flag --" + d.Name, true
	}
}

// Environ is a Source over environment variables, read through lookup
// (os.LookupEnv in production).
func Environ(lookup func(string) (string, bool)) Source {
	return func(d Setting) (string, string, bool) {
		v, ok := lookup(d.Env())
		return v, "environment variable " + d.Env(), ok
	}
}

// Annotations is a Source over pod annotations.
func Annotations(annotations map[string]string) Source {
	return func(d Setting) (string, string, bool) {
		if !d.Annotation {
			return "", "", false
		}
		v, ok := annotations[d.AnnotationKey()]
		return v, "annotation " + d.AnnotationKey(), ok
	}
}

// Error is an invalid value for one setting.
type Error struct {
	Setting string // setting name, e.g. "lease-duration"
	Origin  string // where the value came from
	Value   string
	Form    string // the accepted form
	Reason  string
}

func (e *Error) Error() string {
	if e.Value == "" && e.Origin == "" {
		return fmt.Sprintf("%s: %s; want %s", e.Setting, e.Reason, e.Form)
	}
	return fmt.Sprintf("%s: invalid value %q for %s: %s; want %s", e.Setting, e.Value, e.Origin, e.Reason, e.Form)
}

// validate checks the relations between settings whose own values are
// valid; client-go's elector refuses the same timings, but without naming
// the setting.
func (s *Settings) validate(invalid map[string]bool) []error {
	var errs []error
	bad := func(name, reason string) {
		d, _ := Lookup(name)
		form := d.Form
		if strings.HasPrefix(reason, "required") {
			form = d.RequiredForm()
		}
		errs = append(errs, &Error{Setting: name, Reason: reason, Form: form})
	}
	valid := func(names ...string) bool {
		for _, n := range names {
			if invalid[n] {
				return false
			}
		}
		return true
	}
	if valid("renew-deadline", "lease-duration") && s.RenewDeadline >= s.LeaseDuration {
		bad("renew-deadline", fmt.Sprintf("%s is not shorter than lease-duration %s", s.RenewDeadline, s.LeaseDuration))
	}
	if valid("renew-deadline", "retry-period") && float64(s.RenewDeadline) <= 1.2*float64(s.RetryPeriod) {
		bad("retry-period", fmt.Sprintf("%s times 1.2 (client-go's jitter) is not under renew-deadline %s", s.RetryPeriod, s.RenewDeadline))
	}
	if valid("leases", "role-leases") {
		for _, r := range s.RoleLeases {
			if !slices.Contains(s.Leases, r) {
				bad("role-leases", fmt.Sprintf("%q is not one of leases %q", r, strings.Join(s.Leases, ",")))
			}
		}
	}
	if valid("leases", "shards") {
		for _, n := range s.Shards {
			if slices.Contains(s.Leases, n) {
				bad("shards", fmt.Sprintf("%q is also one of leases: a Lease is either competed for by every pod or a shard", n))
			}
		}
	}
	if valid("shards", "shard-peers") && len(s.Shards) > 0 && s.ShardPeers == "" {
		bad("shard-peers", "required when shards are set: it selects the pods that share them")
	}
	// The holder identity is pod-name_pod-uid: each one missing is named.
	for _, id := range []struct {
		name  string
		empty bool
	}{{"pod-name", s.PodName == ""}, {"pod-uid", s.PodUID == ""}} {
		switch {
		case !id.empty:
		case valid("shards") && len(s.Shards) > 0:
			bad(id.name, "required when shards are set: with pod-name and pod-uid it makes the holder identity and the pod's place among its peers")
		case valid("leases") && len(s.Leases) > 0:
			bad(id.name, "required when leases are set: pod-name and pod-uid make the holder identity")
		}
	}
	return errs
}

// durationSyntax is the syntax time.ParseDuration reads: a value that has
// it, yet does not parse, is beyond the ±292 years a time.Duration holds.
var durationSyntax = regexp.MustCompile(`^[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+)$`)

// duration parses a duration from minimum to maximum, both included; one
// too long for a time.Duration is above the maximum, not "not a duration".
// setBool sets a bool setting: "true" or "false", exactly.
func setBool(field func(*Settings) *bool) func(*Settings, string) error {
	return func(s *Settings, v string) error {
		switch v {
		case "true":
			*field(s) = true
		case "false":
			*field(s) = false
		default:
			return errors.New("not true or false")
		}
		return nil
	}
}

func duration(field func(*Settings) *time.Duration, minimum, maximum time.Duration) func(*Settings, string) error {
	return func(s *Settings, v string) error {
		d, err := time.ParseDuration(v)
		switch {
		case err != nil && durationSyntax.MatchString(v) && strings.HasPrefix(v, "-"):
			return fmt.Errorf("below the minimum %s", minimum)
		case err != nil && durationSyntax.MatchString(v):
			return fmt.Errorf("above the maximum %s", maximum)
		case err != nil:
			return errors.New("not a duration")
		case d < minimum:
			return fmt.Errorf("below the minimum %s", minimum)
		case d > maximum:
			return fmt.Errorf("above the maximum %s", maximum)
		}
		*field(s) = d
		return nil
	}
}

func setLeases(s *Settings, v string) error {
	names, err := leaseNames(v)
	s.Leases = names
	return err
}

// maxShards bounds a shard set: the Lease client's budget holds at most
// leaderelection.MaxClientQPS requests/s, and every pod watches each Lease
// it may be assigned.
const maxShards = 1000

func setShards(s *Settings, v string) error {
	names, err := ParseShards(v)
	s.Shards = names
	return err
}

// ParseShards parses a shard set as the setting shards takes it: PREFIX{0..K}
// for the Lease names PREFIX0 to PREFIXK, or comma-separated distinct Lease
// names (DNS subdomains); at most 1000. "" is no shard set. The error says
// what is wrong with v, without the setting's name.
func ParseShards(v string) ([]string, error) {
	v = strings.TrimSpace(v)
	if open := strings.IndexByte(v, '{'); open >= 0 {
		if strings.Contains(v, ",") {
			return nil, errors.New("a range PREFIX{0..K} is the whole set: it cannot be mixed with a list of names")
		}
		if !strings.HasSuffix(v, "}") {
			return nil, errors.New("a range is PREFIX{0..K}, at the end of the name")
		}
		prefix, rng := v[:open], v[open+1:len(v)-1]
		lo, hi, ok := strings.Cut(rng, "..")
		last, err := strconv.Atoi(hi)
		// Written as the names are made: no sign, no leading zero ({00..11}
		// would read as orders-00, but makes orders-0).
		if !ok || lo != "0" || err != nil || last < 0 || hi != strconv.Itoa(last) {
			return nil, fmt.Errorf("range {%s} is not {0..K} with K a number from 0, without leading zeros", rng)
		}
		if last >= maxShards {
			return nil, fmt.Errorf("%d shards: at most %d", last+1, maxShards)
		}
		names := make([]string, 0, last+1)
		for i := 0; i <= last; i++ {
			names = append(names, prefix+strconv.Itoa(i))
		}
		v = strings.Join(names, ",")
	}
	names, err := leaseNames(v)
	if err == nil && len(names) > maxShards {
		err = fmt.Errorf("%d shards: at most %d", len(names), maxShards)
	}
	return names, err
}

func setShardPeers(s *Settings, v string) error {
	v = strings.TrimSpace(v)
	if v != "" {
		sel, err := labels.Parse(v)
		if err != nil {
			return fmt.Errorf("not a label selector: %w", err)
		}
		if sel.Empty() {
			return errors.New("selects every pod")
		}
	}
	s.ShardPeers = v
	return nil
}

func setRoleLeases(s *Settings, v string) error {
	names, err := leaseNames(v)
	s.RoleLeases = names
	return err
}

// leaseNames parses a comma-separated list of distinct Lease names.
func leaseNames(v string) ([]string, error) {
	var names []string
	seen := map[string]bool{}
	for _, n := range strings.Split(v, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if len(validation.IsDNS1123Subdomain(n)) > 0 {
			return nil, fmt.Errorf("%q is not a DNS subdomain name", n)
		}
		if seen[n] {
			return nil, fmt.Errorf("%q is listed twice", n)
		}
		seen[n] = true
		names = append(names, n)
	}
	return names, nil
}

func setWorkerContainer(s *Settings, v string) error {
	if v != "" && len(validation.IsDNS1123Label(v)) > 0 {
		return errors.New("not a container name")
	}
	s.WorkerContainer = v
	return nil
}

func setFallback(s *Settings, v string) error {
	switch f := Fallback(v); f {
	case FallbackReturn, FallbackCancel, FallbackAbandon:
		s.Fallback = f
		return nil
	}
	return errors.New("unknown policy")
}

func setLogLevel(s *Settings, v string) error {
	switch l := LogLevel(v); l {
	case LogLevelError, LogLevelInfo, LogLevelDebug:
		s.LogLevel = l
		return nil
	}
	return errors.New("unknown level")
}

func setControlAddr(s *Settings, v string) error {
	e, err := endpoint(v)
	s.ControlAddr = e
	return err
}

func setMetricsAddr(s *Settings, v string) error {
	if _, err := hostPort(v); err != nil {
		return err
	}
	s.MetricsAddr = v
	return nil
}

func setAppURL(s *Settings, v string) error {
	e, err := endpoint(v)
	s.AppURL = e
	return err
}

// endpoint parses a protocol address (protocol.ParseEndpoint) into an error
// without the value, which config.Error names already.
func endpoint(v string) (protocol.Endpoint, error) {
	e, err := protocol.ParseEndpoint(v)
	if ee := (*protocol.EndpointError)(nil); errors.As(err, &ee) {
		return protocol.Endpoint{}, errors.New(ee.Reason)
	}
	return e, err
}

// hostPort checks a host:port whose port is a number from 0 to 65535 (0:
// any free port) and returns the host.
func hostPort(v string) (string, error) {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return "", errors.New("not a host:port")
	}
	if _, err := Port(port); err != nil {
		return "", err
	}
	return host, nil
}

// Port parses a port number, 0 to 65535.
func Port(p string) (int, error) {
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return 0, fmt.Errorf("port %q is not a number from 0 to 65535", p)
	}
	return n, nil
}
