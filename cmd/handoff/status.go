//go:build !sidecaronly

package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
)

const statusLong = `status shows, from the API server alone (no port-forward, nothing asked of a
pod), what handoff does in a namespace: each Lease its injected pods compete
for, with its holder pod, the term it has left and its fencing token; each
shard set, with the shards each pod holds against its fair share and the
shards no pod holds; and each injected pod, with its version, its phase and
its last handover, read from the pod's Events.

  Leases   the Leases named by the injected pods' sidecars (HANDOFF_LEASES,
           HANDOFF_SHARDS as injection sets them from the handoff.dev/
           annotations). STATE is Held (its holder renews it), Free (released:
           no holder), Expired (its holder stopped renewing and its lease
           duration has passed since) or Missing (not created yet: no pod
           has led it). TERM LEFT is renewTime plus leaseDurationSeconds,
           less now; FENCING TOKEN is spec.leaseTransitions, which the
           holder's fencing token is.
  Shards   per shard set: the peers up (injected pods of the set not being
           deleted), the fair share ceil(N/M) each aims at, the shards each
           pod holds, and the shards held by none.
  Pods     PHASE is the sidecar's, as it writes it on its pod (the condition
           handoff.dev/Coordinating, within a request of each change):
           Running (a preStop would hand over), ShuttingDown (a sequence is
           under way), Rearming (a sequence is over in a pod that stays: a
           worker restart), Done (the last sequence is over, the pod is
           leaving); or the pod's phase while it is Pending. Where the
           sidecar wrote none (an older sidecar), or still says Running on a
           pod being deleted, it is inferred: Running (not being deleted),
           ShuttingDown (deletion requested, and the pod still holds a Lease
           or its drain has not ended: no Drained or DrainDeadlineExceeded
           Event yet), Done (deletion requested, every Lease released, the
           drain over). -o json says which (phaseFrom: sidecar, inferred). LAST HANDOVER is the outcome of the pod's last shutdown
           sequence and its steps, from its Events (DrainStarted, Drained,
           DrainDeadlineExceeded, LeaseReleased, ...): they carry the step
           times in milliseconds in their messages; an Event's own time has
           whole seconds. Events reach the API server within about a second
           of the step and are kept an hour by default (the API server's
           --event-ttl). -o wide adds DELETION COST: the pod's
           controller.kubernetes.io/pod-deletion-cost, which its sidecar keeps
           with handoff.dev/deletion-cost: "true" (docs/scale-in.md).

--watch prints the view again each time a Lease, an injected pod or an Event
of the namespace changes (at most twice a second), until interrupted; with -o
json, one JSON object a line.

The kubeconfig is read as kubectl reads it (--kubeconfig, KUBECONFIG,
~/.kube/config, in-cluster; --context). It needs get, list and watch on
Leases, pods and Events in the namespace. With -o json (yaml: the same) this
shape:

  {
    "time": "<RFC 3339, when read>",
    "namespace": "shop",
    "selector": "handoff.dev/injected=true",
    "leases": [{"name": "orders-leader", "kind": "role", "state": "Held",
                "holderIdentity": "orders-7d9-abcde_<pod uid>", "holderPod": "orders-7d9-abcde",
                "termLeftSeconds": 12.3, "fencingToken": 4, "renewTime": "...",
                "leaseDurationSeconds": 15}],
    "shardSets": [{"shards": "orders-{0..3}", "leases": ["orders-0", ...], "peers": 2,
                   "fairShare": 2, "owners": [{"pod": "...", "shards": ["orders-0"]}],
                   "unowned": ["orders-3"]}],
    "pods": [{"name": "...", "version": "v0.2.0", "phase": "Running", "phaseFrom": "sidecar", "ready": true,
              "deletionTimestamp": "<only while deleted>", "leases": ["orders-leader"],
              "lastHandover": {"outcome": "Drained", "steps": [{"reason": "DrainStarted",
                                "time": "...", "message": "..."}]},
              "deletionCost": 10010}],
    "warnings": ["<what could not be read in full: more than 5000 Events about pods>"]
  }`

// statusReport is what `handoff status` prints; with -o json exactly this
// shape (statusLong).
type statusReport struct {
	Time      time.Time      `json:"time"`
	Namespace string         `json:"namespace"`
	Selector  string         `json:"selector"`
	Leases    []leaseView    `json:"leases"`
	ShardSets []shardSetView `json:"shardSets"`
	Pods      []podView      `json:"pods"`
	// Warnings say what the view could not read in full.
	Warnings []string `json:"warnings,omitempty"`
}

// Lease states, as leaseView.State.
const (
	leaseHeld    = "Held"
	leaseFree    = "Free"
	leaseExpired = "Expired"
	leaseMissing = "Missing"
)

// leaseView is one Lease as status shows it.
type leaseView struct {
	Name string             `json:"name"`
	Kind protocol.LeaseKind `json:"kind"`
	// State is Held, Free, Expired or Missing (statusLong).
	State          string `json:"state"`
	HolderIdentity string `json:"holderIdentity,omitempty"`
	// HolderPod is the injected pod whose name and UID the holder identity
	// is; "" when it is none of them.
	HolderPod string `json:"holderPod,omitempty"`
	// TermLeftSeconds is renewTime + leaseDurationSeconds - Time, in
	// seconds; 0 unless Held.
	TermLeftSeconds      float64    `json:"termLeftSeconds"`
	FencingToken         int64      `json:"fencingToken"`
	RenewTime            *time.Time `json:"renewTime,omitempty"`
	LeaseDurationSeconds int32      `json:"leaseDurationSeconds,omitempty"`
}

// shardSetView is one set of shard Leases and who holds them.
type shardSetView struct {
	// Shards is the set as the pods configure it (HANDOFF_SHARDS).
	Shards string   `json:"shards"`
	Leases []string `json:"leases"`
	// Peers is the number of injected pods of the set not being deleted;
	// FairShare is ceil(len(Leases)/Peers), 0 without peers.
	Peers     int          `json:"peers"`
	FairShare int          `json:"fairShare"`
	Owners    []shardOwner `json:"owners"`
	// Unowned are the shards no pod holds (Free, Expired or Missing).
	Unowned []string `json:"unowned"`
}

// shardOwner is the shards one pod holds.
type shardOwner struct {
	Pod    string   `json:"pod"`
	Shards []string `json:"shards"`
}

// Pod phases, as podView.Phase (besides the pod's own, while Pending).
const (
	phaseRunning      = string(protocol.PhaseRunning)
	phaseShuttingDown = string(protocol.PhaseShuttingDown)
	phaseRearming     = string(protocol.PhaseRearming)
	phaseDone         = string(protocol.PhaseDone)
)

// Where podView.Phase comes from.
const (
	phaseFromSidecar = "sidecar"  // the pod's condition handoff.dev/Coordinating, which the sidecar writes
	phaseInferred    = "inferred" // the pod's deletion, its Leases and its Events (a sidecar that writes no condition)
)

// sidecarPhase is the phase the pod's sidecar wrote on its status (the
// condition protocol.PodConditionCoordinating's reason), if it wrote one
// this view knows.
func sidecarPhase(p *corev1.Pod) (string, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == protocol.PodConditionCoordinating {
			switch c.Reason {
			case phaseRunning, phaseShuttingDown, phaseRearming, phaseDone:
				return c.Reason, true
			}
		}
	}
	return "", false
}

// podView is one injected pod.
type podView struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Phase is Running, ShuttingDown, Rearming, Done, or the pod's phase
	// while it is Pending (statusLong); PhaseFrom says whether the sidecar
	// wrote it (sidecar) or the view inferred it (inferred).
	Phase             string     `json:"phase"`
	PhaseFrom         string     `json:"phaseFrom"`
	Ready             bool       `json:"ready"`
	DeletionTimestamp *time.Time `json:"deletionTimestamp,omitempty"`
	// Leases are the Leases the pod holds now (State Held), shards among
	// them.
	Leases       []string      `json:"leases"`
	LastHandover *handoverView `json:"lastHandover,omitempty"`
	// DeletionCost is the pod's controller.kubernetes.io/pod-deletion-cost,
	// which its sidecar keeps with the setting deletion-cost
	// (docs/scale-in.md); nil when the pod has none.
	DeletionCost *int32 `json:"deletionCost,omitempty"`
}

// handoverInProgress is handoverView.Outcome until an Event ends the
// sequence.
const handoverInProgress = "InProgress"

// handoverFailed is handoverView.Outcome when a Lease was not released.
const handoverFailed = "Failed"

// handoverView is a pod's last shutdown sequence, from its Events.
type handoverView struct {
	// Outcome is Drained, Returned (or Canceled), Abandoned, Failed (a
	// Lease not released), or InProgress while no Event has ended it.
	Outcome string     `json:"outcome"`
	Steps   []stepView `json:"steps"`
}

// stepView is one Event of a handover.
type stepView struct {
	Reason  string    `json:"reason"`
	Time    time.Time `json:"time"`
	Message string    `json:"message"`
	Count   int32     `json:"count,omitempty"`
}

// handoverReasons are the reasons of the Events a shutdown sequence writes.
var handoverReasons = []string{sidecar.ReasonDrainStarted, sidecar.ReasonDrained, sidecar.ReasonDeadlineExceeded,
	sidecar.ReasonClaimsReturned, sidecar.ReasonLeaseReleased, sidecar.ReasonReleaseWithheld, sidecar.ReasonHandoverFailed}

// statusLimits bound what one view reads, so that a large namespace costs a
// bounded time and memory: at most this many injected pods, Events and
// Leases are read (a view that reached one says so in its error).
const (
	statusMaxPods   = 2000
	statusMaxEvents = 5000
	statusMaxLeases = 2000
	// statusMaxNamespaceLeases bounds the Leases of the namespace read to
	// find the pods' (in pages of listPage).
	statusMaxNamespaceLeases = 20000
)

func statusCommand() *cobra.Command {
	var (
		kube             kubeFlags
		format, selector string
		timeout          time.Duration
		watchFlag        bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the Leases, shards, drains and last handovers of a namespace's injected pods",
		Long:  statusLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var errs []error
			if format != "" && format != "json" && format != "yaml" && format != "wide" {
				errs = append(errs, fmt.Errorf("--output %q: want json, yaml or wide, or none for text", format))
			}
			if timeout <= 0 {
				errs = append(errs, fmt.Errorf("--timeout %s: want a duration above 0, like 10s", timeout))
			}
			if _, err := labels.Parse(selector); err != nil {
				errs = append(errs, fmt.Errorf("--selector %q: want a label selector, like app=orders: %w", selector, err))
			}
			if err := errors.Join(append(errs, kube.check())...); err != nil {
				return err
			}
			client, ns, err := kube.client(timeout)
			if err != nil {
				return err
			}
			sel := sidecarSelector
			if selector != "" {
				sel += "," + selector
			}
			q := statusQuery{client: client, namespace: ns, selector: sel, timeout: timeout}
			if !watchFlag {
				r, err := q.read(cmd.Context())
				if err != nil {
					return err
				}
				return writeStatus(cmd.OutOrStdout(), r, format)
			}
			return q.watch(cmd.Context(), func(r statusReport) error { return writeStatus(cmd.OutOrStdout(), r, format) })
		},
	}
	f := cmd.Flags()
	f.StringVarP(&format, "output", "o", "", "json, yaml (the shape above) or wide (more columns); text without it")
	kube.add(f, "namespace; empty: the kubeconfig context's, else default")
	f.StringVarP(&selector, "selector", "l", "", "label selector of the workload's pods, like app=orders, besides handoff.dev/injected=true")
	f.DurationVar(&timeout, "timeout", 10*time.Second, "how long the API server may take to answer each view, in all")
	f.BoolVarP(&watchFlag, "watch", "w", false, "print the view again on every change, until interrupted")
	return cmd
}

// statusQuery is where status looks, and how long one view may take.
type statusQuery struct {
	client              kubernetes.Interface
	namespace, selector string
	timeout             time.Duration
}

// read makes one view within q.timeout, from lists of the injected pods,
// the namespace's Events about pods, and the Leases the pods name.
func (q statusQuery) read(ctx context.Context) (statusReport, error) {
	r, _, err := q.readAt(ctx)
	return r, err
}

// readAt is read, with the resource versions of its pod and Event lists
// (for watch).
func (q statusQuery) readAt(ctx context.Context) (statusReport, [2]string, error) {
	ctx, cancel := context.WithTimeout(ctx, q.timeout)
	defer cancel()
	var rvs [2]string
	pods, err := q.client.CoreV1().Pods(q.namespace).List(ctx, metav1.ListOptions{LabelSelector: q.selector, Limit: statusMaxPods})
	if err != nil {
		return statusReport{}, rvs, fmt.Errorf("listing the injected pods (%s) in namespace %s: %w", q.selector, q.namespace, err)
	}
	if pods.Continue != "" {
		return statusReport{}, rvs, fmt.Errorf("namespace %s has more than %d injected pods matching %s: narrow it with --selector", q.namespace, statusMaxPods, q.selector)
	}
	events, err := q.client.CoreV1().Events(q.namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.kind", "Pod").String(), Limit: statusMaxEvents})
	if err != nil {
		return statusReport{}, rvs, fmt.Errorf("listing the Events about pods in namespace %s: %w", q.namespace, err)
	}
	rvs = [2]string{pods.ResourceVersion, events.ResourceVersion}
	names := map[string]bool{}
	for i := range pods.Items {
		c := podConfig(&pods.Items[i])
		for _, l := range append(slices.Clone(c.leases), c.shardLeases...) {
			names[l] = true
		}
	}
	if len(names) > statusMaxLeases {
		return statusReport{}, rvs, fmt.Errorf("the injected pods in namespace %s name %d Leases, more than %d: narrow it with --selector", q.namespace, len(names), statusMaxLeases)
	}
	leases := map[string]*coordinationv1.Lease{}
	opts := metav1.ListOptions{Limit: listPage}
	for read := 0; len(names) > 0; {
		list, err := q.client.CoordinationV1().Leases(q.namespace).List(ctx, opts)
		if err != nil {
			return statusReport{}, rvs, fmt.Errorf("listing the Leases in namespace %s: %w", q.namespace, err)
		}
		for i := range list.Items {
			if l := &list.Items[i]; names[l.Name] {
				leases[l.Name] = l
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
		if read += len(list.Items); read >= statusMaxNamespaceLeases {
			return statusReport{}, rvs, fmt.Errorf("namespace %s has more than %d Leases: status reads them all to find its pods'", q.namespace, statusMaxNamespaceLeases)
		}
	}
	r := buildStatus(time.Now(), q.namespace, q.selector, pods.Items, events.Items, leases)
	if events.Continue != "" {
		r.Warnings = append(r.Warnings, fmt.Sprintf("namespace %s has more than %d Events about pods: only the first %d were read, so a last handover may lack steps", q.namespace, statusMaxEvents, statusMaxEvents))
	}
	return r, rvs, nil
}

// watch calls show with a view, then again each time a pod, an Event or a
// Lease of the namespace changes (at most twice a second), until ctx ends
// (nil) or a view cannot be read (its error).
func (q statusQuery) watch(ctx context.Context, show func(statusReport) error) error {
	for {
		r, rvs, err := q.readAt(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := show(r); err != nil {
			return err
		}
		changed, stop, err := q.watchChanges(ctx, rvs)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-changed:
		}
		stop()
		// At most twice a second: a rollout changes many objects at once.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// watchChanges watches the injected pods and the Events about pods from
// the resource versions rvs, and the Leases of the namespace; changed is
// closed at the first change (or when a watch ends: the view is read
// again). stop ends the watches.
func (q statusQuery) watchChanges(ctx context.Context, rvs [2]string) (changed <-chan struct{}, stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	pw, err := q.client.CoreV1().Pods(q.namespace).Watch(ctx, metav1.ListOptions{LabelSelector: q.selector, ResourceVersion: rvs[0]})
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("watching the injected pods in namespace %s: %w", q.namespace, err)
	}
	ew, err := q.client.CoreV1().Events(q.namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.kind", "Pod").String(), ResourceVersion: rvs[1]})
	if err != nil {
		pw.Stop()
		cancel()
		return nil, nil, fmt.Errorf("watching the Events in namespace %s: %w", q.namespace, err)
	}
	// Leases from now: a renewal changes the term left, which the view
	// shows, so every Lease update is a change.
	lw, err := q.client.CoordinationV1().Leases(q.namespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		pw.Stop()
		ew.Stop()
		cancel()
		return nil, nil, fmt.Errorf("watching the Leases in namespace %s: %w", q.namespace, err)
	}
	ch := make(chan struct{})
	first := make(chan struct{}, 3)
	for _, w := range []watch.Interface{pw, ew, lw} {
		go func() {
			select {
			case <-w.ResultChan():
			case <-ctx.Done():
			}
			first <- struct{}{}
		}()
	}
	go func() {
		select {
		case <-first:
			close(ch)
		case <-ctx.Done():
		}
	}()
	return ch, func() {
		cancel()
		pw.Stop()
		ew.Stop()
		lw.Stop()
	}, nil
}

// sidecarConfig is what status needs of a pod's sidecar settings.
type sidecarConfig struct {
	leases, roles []string
	// shards is HANDOFF_SHARDS as written; shardLeases its Lease names.
	shards      string
	shardLeases []string
}

// sidecarEnv looks up the environment of p's sidecar container (the first
// container or init container named inject.SidecarName) by variable name:
// its values as written, as injection writes them; a reference (valueFrom)
// is not found.
func sidecarEnv(p *corev1.Pod) func(name string) (string, bool) {
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

// podConfig reads the sidecar's Lease settings from its container's
// environment (sidecarEnv), else from the pod's handoff.dev/ annotations. A
// value that does not parse counts as none: the sidecar itself refuses it.
func podConfig(p *corev1.Pod) sidecarConfig {
	env := sidecarEnv(p)
	get := func(name string) string {
		d, _ := config.Lookup(name)
		if v, ok := env(d.Env()); ok {
			return v
		}
		return p.Annotations[d.AnnotationKey()]
	}
	split := func(v string) []string {
		var out []string
		for s := range strings.SplitSeq(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		return out
	}
	c := sidecarConfig{leases: split(get("leases")), roles: split(get("role-leases")), shards: get("shards")}
	if c.shards != "" {
		if names, err := config.ParseShards(c.shards); err == nil {
			c.shardLeases = names
		}
	}
	return c
}

// buildStatus makes the view at now of the injected pods, the Events about
// pods of the namespace, and the Leases by name.
func buildStatus(now time.Time, ns, selector string, pods []corev1.Pod, events []corev1.Event, leases map[string]*coordinationv1.Lease) statusReport {
	r := statusReport{Time: now.UTC().Truncate(time.Millisecond), Namespace: ns, Selector: selector,
		Leases: []leaseView{}, ShardSets: []shardSetView{}, Pods: []podView{}}
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	byIdentity := map[string]string{}
	kinds := map[string]protocol.LeaseKind{}
	sets := map[string][]string{} // shards setting -> Lease names
	setPods := map[string][]int{} // shards setting -> pods (index) of the set
	for i := range pods {
		p := &pods[i]
		byIdentity[p.Name+"_"+string(p.UID)] = p.Name
		c := podConfig(p)
		for _, l := range c.leases {
			if _, ok := kinds[l]; !ok {
				kinds[l] = protocol.LeaseKindPartition
			}
			if slices.Contains(c.roles, l) {
				kinds[l] = protocol.LeaseKindRole
			}
		}
		for _, l := range c.shardLeases {
			kinds[l] = protocol.LeaseKindPartition
		}
		if c.shards != "" && len(c.shardLeases) > 0 {
			sets[c.shards] = c.shardLeases
			setPods[c.shards] = append(setPods[c.shards], i)
		}
	}
	held := map[string][]string{} // pod -> Leases held
	for _, name := range slices.Sorted(maps.Keys(kinds)) {
		v := leaseView{Name: name, Kind: kinds[name], State: leaseMissing}
		if l := leases[name]; l != nil {
			v.State = leaseFree
			if l.Spec.LeaseTransitions != nil {
				v.FencingToken = int64(*l.Spec.LeaseTransitions)
			}
			if l.Spec.LeaseDurationSeconds != nil {
				v.LeaseDurationSeconds = *l.Spec.LeaseDurationSeconds
			}
			if l.Spec.RenewTime != nil {
				t := l.Spec.RenewTime.UTC()
				v.RenewTime = &t
			}
			if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
				v.HolderIdentity = *l.Spec.HolderIdentity
				v.HolderPod = byIdentity[v.HolderIdentity]
				v.State = leaseExpired
				if v.RenewTime != nil {
					left := v.RenewTime.Add(time.Duration(v.LeaseDurationSeconds) * time.Second).Sub(now)
					if left > 0 {
						v.State = leaseHeld
						v.TermLeftSeconds = math.Round(left.Seconds()*10) / 10
					}
				}
			}
		}
		if v.State == leaseHeld && v.HolderPod != "" {
			held[v.HolderPod] = append(held[v.HolderPod], name)
		}
		r.Leases = append(r.Leases, v)
	}
	for _, set := range slices.Sorted(maps.Keys(sets)) {
		s := shardSetView{Shards: set, Leases: sets[set], Owners: []shardOwner{}, Unowned: []string{}}
		owned := map[string]bool{}
		for _, i := range setPods[set] {
			p := &pods[i]
			if p.DeletionTimestamp == nil {
				s.Peers++
			}
			var mine []string
			for _, l := range held[p.Name] {
				if slices.Contains(s.Leases, l) {
					mine = append(mine, l)
					owned[l] = true
				}
			}
			if len(mine) > 0 {
				s.Owners = append(s.Owners, shardOwner{Pod: p.Name, Shards: mine})
			}
		}
		if s.Peers > 0 {
			s.FairShare = (len(s.Leases) + s.Peers - 1) / s.Peers
		}
		for _, l := range s.Leases {
			if !owned[l] {
				s.Unowned = append(s.Unowned, l)
			}
		}
		r.ShardSets = append(r.ShardSets, s)
	}
	byPod := map[string][]corev1.Event{} // pod UID -> its handoff Events
	for _, e := range events {
		if slices.Contains(handoverReasons, e.Reason) || e.Reason == sidecar.ReasonRearmed {
			byPod[string(e.InvolvedObject.UID)] = append(byPod[string(e.InvolvedObject.UID)], e)
		}
	}
	for i := range pods {
		p := &pods[i]
		v := podView{Name: p.Name, Version: p.Annotations[inject.AnnotationVersion], Phase: phaseRunning, Leases: held[p.Name]}
		if v.Leases == nil {
			v.Leases = []string{}
		}
		if v.Version == "" {
			v.Version = unknownVersion
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				v.Ready = c.Status == corev1.ConditionTrue
			}
		}
		v.LastHandover = lastHandover(byPod[string(p.UID)])
		if c, err := strconv.ParseInt(p.Annotations[corev1.PodDeletionCost], 10, 32); err == nil {
			v.DeletionCost = ptr.To(int32(c))
		}
		v.PhaseFrom = phaseInferred
		switch {
		case p.DeletionTimestamp != nil:
			t := p.DeletionTimestamp.UTC()
			v.DeletionTimestamp = &t
			v.Phase = phaseDone
			if len(v.Leases) > 0 || (v.LastHandover != nil && v.LastHandover.Outcome == handoverInProgress) {
				v.Phase = phaseShuttingDown
			}
		case p.Status.Phase == corev1.PodPending:
			v.Phase = string(corev1.PodPending)
		}
		if phase, ok := sidecarPhase(p); ok && p.Status.Phase != corev1.PodPending &&
			(p.DeletionTimestamp == nil || phase != phaseRunning) {
			// The sidecar's own word, but for Running on a pod being
			// deleted: its sequence has begun and not been written yet.
			v.Phase, v.PhaseFrom = phase, phaseFromSidecar
		}
		r.Pods = append(r.Pods, v)
	}
	return r
}

// lastHandover is the last shutdown sequence of the Events of one pod: the
// handover Events after its last Rearmed (a sequence ended, the worker
// restarted, the sidecar rejoined), in order; nil when there are none.
func lastHandover(events []corev1.Event) *handoverView {
	at := func(e corev1.Event) time.Time {
		switch {
		case !e.EventTime.IsZero():
			return e.EventTime.Time
		case !e.LastTimestamp.IsZero():
			return e.LastTimestamp.Time
		}
		return e.FirstTimestamp.Time
	}
	// An Event's time has whole seconds: within one second, the order the
	// sequence writes them in (handoverReasons), Rearmed last.
	rank := func(e corev1.Event) int {
		if i := slices.Index(handoverReasons, e.Reason); i >= 0 {
			return i
		}
		return len(handoverReasons)
	}
	slices.SortStableFunc(events, func(a, b corev1.Event) int {
		return cmp.Or(at(a).Compare(at(b)), cmp.Compare(rank(a), rank(b)))
	})
	start := 0
	for i, e := range events {
		if e.Reason == sidecar.ReasonRearmed {
			start = i + 1
		}
	}
	events = events[start:]
	if len(events) == 0 {
		return nil
	}
	h := &handoverView{Outcome: handoverInProgress}
	seen := map[string]bool{}
	abandoned := false
	for _, e := range events {
		h.Steps = append(h.Steps, stepView{Reason: e.Reason, Time: at(e).UTC(), Message: e.Message, Count: max(e.Count, 0)})
		seen[e.Reason] = true
		if e.Reason == sidecar.ReasonDeadlineExceeded && strings.Contains(e.Message, "fallback "+string(config.FallbackAbandon)) {
			abandoned = true
		}
	}
	// The outcome from which Events there are, not their order (which
	// whole seconds can hide).
	switch {
	case seen[sidecar.ReasonHandoverFailed] || seen[sidecar.ReasonReleaseWithheld]:
		h.Outcome = handoverFailed
	case abandoned:
		h.Outcome = string(protocol.OutcomeAbandoned)
	case seen[sidecar.ReasonDeadlineExceeded]:
		h.Outcome = string(protocol.OutcomeReturned)
	case seen[sidecar.ReasonDrained]:
		h.Outcome = string(protocol.OutcomeDrained)
	case seen[sidecar.ReasonLeaseReleased] && !seen[sidecar.ReasonDrainStarted]:
		// Released with no drain: the app was gone. (A role Lease is
		// released during the drain, after DrainStarted.)
		h.Outcome = string(protocol.OutcomeAppGone)
	}
	return h
}

// writeStatus prints r as format: "" (text), "wide", "json" (one line,
// so that --watch prints one object a line) or "yaml".
func writeStatus(w io.Writer, r statusReport, format string) error {
	switch format {
	case "json":
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "---\n%s", b)
		return err
	}
	wide := format == "wide"
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Namespace %s, pods %s, at %s\n", r.Namespace, r.Selector, r.Time.Format(time.RFC3339))
	for _, warning := range r.Warnings {
		fmt.Fprintf(tw, "Warning: %s\n", warning)
	}
	fmt.Fprintln(tw)
	if len(r.Leases) == 0 {
		fmt.Fprintln(tw, "No Leases: no injected pod names one.")
	} else {
		head := "LEASE\tKIND\tSTATE\tHOLDER\tTERM LEFT\tFENCING TOKEN"
		if wide {
			head += "\tHOLDER IDENTITY\tRENEWED\tLEASE DURATION"
		}
		fmt.Fprintln(tw, head)
		for _, l := range r.Leases {
			holder, left := dash(l.HolderPod), "-"
			if l.HolderPod == "" && l.HolderIdentity != "" {
				holder = "(not an injected pod)"
			}
			if l.State == leaseHeld {
				left = fmt.Sprintf("%.1fs", l.TermLeftSeconds)
			}
			line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d", l.Name, l.Kind, l.State, holder, left, l.FencingToken)
			if wide {
				renewed := "-"
				if l.RenewTime != nil {
					renewed = l.RenewTime.Format(time.RFC3339Nano)
				}
				line += fmt.Sprintf("\t%s\t%s\t%ds", dash(l.HolderIdentity), renewed, l.LeaseDurationSeconds)
			}
			fmt.Fprintln(tw, line)
		}
	}
	for _, s := range r.ShardSets {
		fmt.Fprintf(tw, "\nShards %s: %d shards, %d peers up, fair share %d\n", s.Shards, len(s.Leases), s.Peers, s.FairShare)
		fmt.Fprintln(tw, "POD\tSHARDS\tCOUNT")
		for _, o := range s.Owners {
			fmt.Fprintf(tw, "%s\t%s\t%d\n", o.Pod, strings.Join(o.Shards, ","), len(o.Shards))
		}
		if len(s.Unowned) > 0 {
			fmt.Fprintf(tw, "(held by none)\t%s\t%d\n", strings.Join(s.Unowned, ","), len(s.Unowned))
		}
	}
	fmt.Fprintln(tw)
	if len(r.Pods) == 0 {
		fmt.Fprintln(tw, "No injected pods.")
		return tw.Flush()
	}
	head := "POD\tVERSION\tPHASE\tREADY\tLEASES\tLAST HANDOVER"
	if wide {
		head += "\tDELETION COST"
	}
	fmt.Fprintln(tw, head)
	for _, p := range r.Pods {
		last := "-"
		if h := p.LastHandover; h != nil {
			end := h.Steps[len(h.Steps)-1]
			last = fmt.Sprintf("%s, %s ago", h.Outcome, r.Time.Sub(end.Time).Round(time.Second))
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%t\t%s\t%s", p.Name, p.Version, p.Phase, p.Ready, dash(strings.Join(p.Leases, ",")), last)
		if wide {
			cost := "-"
			if p.DeletionCost != nil {
				cost = strconv.Itoa(int(*p.DeletionCost))
			}
			line += "\t" + cost
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// The steps of each pod's last handover: always for a drain under way,
	// for every pod with -o wide.
	for _, p := range r.Pods {
		if h := p.LastHandover; h != nil && (wide || p.Phase == phaseShuttingDown) {
			fmt.Fprintf(w, "\n%s, last handover (%s):\n", p.Name, h.Outcome)
			for _, s := range h.Steps {
				count := ""
				if s.Count > 1 {
					count = fmt.Sprintf(" (x%d)", s.Count)
				}
				fmt.Fprintf(w, "  %s  %-22s %s%s\n", s.Time.Format("15:04:05"), s.Reason, s.Message, count)
			}
		}
	}
	return nil
}

func dash(s string) string { return cmp.Or(s, "-") }
