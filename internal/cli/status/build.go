package status

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/cli/kube"
	"github.com/handoff-dev/handoff/protocol"
	coord "github.com/handoff-dev/handoff/sidecar"
)

// sidecarConfig is what status needs of a pod's sidecar settings.
type sidecarConfig struct {
	leases, roles []string
	// shards is HANDOFF_SHARDS as written; shardLeases its Lease names.
	shards      string
	shardLeases []string
}

// podConfig reads the sidecar's Lease settings as the sidecar loads them
// (kube.PodSettings: its container's environment), else from the pod's
// handoff.dev/ annotations. Settings that do not load count as none: the
// sidecar itself refuses them.
func podConfig(p *corev1.Pod) sidecarConfig {
	annotations := config.Annotations(p.Annotations)
	s, err := kube.PodSettings(p, annotations)
	if err != nil {
		return sidecarConfig{}
	}
	c := sidecarConfig{leases: s.Leases, roles: s.RoleLeases, shardLeases: s.Shards}
	if len(s.Shards) > 0 {
		c.shards = kube.SidecarSetting(p, "shards", annotations)
	}
	return c
}

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

// buildStatus makes the view at now of the injected pods, the Events about
// pods of the namespace, and the Leases by name.
func buildStatus(now time.Time, ns, selector string, pods []corev1.Pod, events []corev1.Event, leases map[string]*coordinationv1.Lease) Report {
	r := Report{Time: now.UTC().Truncate(time.Millisecond), Namespace: ns, Selector: selector,
		Leases: []LeaseView{}, ShardSets: []ShardSetView{}, Pods: []PodView{}}
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
		v := LeaseView{Name: name, Kind: kinds[name], State: leaseMissing}
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
		s := ShardSetView{Shards: set, Leases: sets[set], Owners: []ShardOwner{}, Unowned: []string{}}
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
				s.Owners = append(s.Owners, ShardOwner{Pod: p.Name, Shards: mine})
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
		if slices.Contains(handoverReasons, e.Reason) || e.Reason == coord.ReasonRearmed {
			byPod[string(e.InvolvedObject.UID)] = append(byPod[string(e.InvolvedObject.UID)], e)
		}
	}
	for i := range pods {
		p := &pods[i]
		v := PodView{Name: p.Name, Version: p.Annotations[inject.AnnotationVersion], Phase: phaseRunning, Leases: held[p.Name]}
		if v.Leases == nil {
			v.Leases = []string{}
		}
		if v.Version == "" {
			v.Version = kube.UnknownVersion
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
func lastHandover(events []corev1.Event) *HandoverView {
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
		if e.Reason == coord.ReasonRearmed {
			start = i + 1
		}
	}
	events = events[start:]
	if len(events) == 0 {
		return nil
	}
	h := &HandoverView{Outcome: handoverInProgress}
	seen := map[string]bool{}
	abandoned := false
	for _, e := range events {
		h.Steps = append(h.Steps, StepView{Reason: e.Reason, Time: at(e).UTC(), Message: e.Message, Count: max(e.Count, 0)})
		seen[e.Reason] = true
		if e.Reason == coord.ReasonDeadlineExceeded && strings.Contains(e.Message, "fallback "+string(config.FallbackAbandon)) {
			abandoned = true
		}
	}
	// The outcome from which Events there are, not their order (which
	// whole seconds can hide).
	switch {
	case seen[coord.ReasonHandoverFailed] || seen[coord.ReasonReleaseWithheld]:
		h.Outcome = handoverFailed
	case abandoned:
		h.Outcome = string(protocol.OutcomeAbandoned)
	case seen[coord.ReasonDeadlineExceeded]:
		h.Outcome = string(protocol.OutcomeReturned)
	case seen[coord.ReasonDrained]:
		h.Outcome = string(protocol.OutcomeDrained)
	case seen[coord.ReasonLeaseReleased] && !seen[coord.ReasonDrainStarted]:
		// Released with no drain: the app was gone. (A role Lease is
		// released during the drain, after DrainStarted.)
		h.Outcome = string(protocol.OutcomeAppGone)
	}
	return h
}
