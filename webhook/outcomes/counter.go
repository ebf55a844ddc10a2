// Package outcomes counts the sidecars' handovers for Prometheus in the
// webhook, a process that outlives the pods: each sidecar records a
// ShutdownFinished Event on its Pod when its shutdown sequence ends, with
// the sequence's outcome, steps, claims and Lease results in its
// annotation (internal/outcome), and waits for its Events to be written
// before it exits. The webhook replica that holds the outcome Lease
// watches those Events and counts each once, into handoff_handovers_total
// and the other handoff_handover_* series, labelled by the pod's
// namespace. The sidecar then needs no scrape before it exits: whatever the
// scrape interval, the counts stay in the webhook (docs/monitoring.md,
// "Handover outcomes").
package outcomes

import (
	"errors"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/lru"

	"github.com/handoff-dev/handoff/internal/outcome"
	"github.com/handoff-dev/handoff/protocol"
)

// Source is the Event source component of the sidecars' Events.
const Source = "handoff"

// Results of an Event seen by the counter: the label result of
// handoff_outcome_events_total.
const (
	EventCounted     = "counted"      // its occurrences counted
	EventDuplicate   = "duplicate"    // seen again with no new occurrence (a relist, an update of another field)
	EventBeforeStart = "before_start" // last written before this leader's start, less the window: another leader's to count
	EventInvalid     = "invalid"      // no summary, or not a valid one: not counted
	EventUnsupported = "unsupported"  // a summary of another version (a newer sidecar's): not counted
)

// Claim kinds: the label claims of handoff_handover_claims_total.
const (
	ClaimsUnstarted  = "unstarted"  // held and not started at stop-claiming, handed back by the app at once
	ClaimsUnfinished = "unfinished" // in flight at the drain deadline
	ClaimsReturned   = "returned"   // handed back by the fallback (return or cancel)
	ClaimsAbandoned  = "abandoned"  // left to the visibility timeout
)

// Metrics are the counter's series, registered on the webhook's registry.
// Every series but the last two is labelled namespace: the namespace of
// the pods whose Events were counted.
type Metrics struct {
	// Handovers is handoff_handovers_total{namespace,outcome}: shutdown
	// sequences ended, by outcome (Drained, Returned, Canceled, Abandoned,
	// AppGone).
	Handovers *prometheus.CounterVec
	// StepSeconds is handoff_handover_step_seconds{namespace,step}: seconds
	// from a sequence's trigger to each step it reached, once a sequence
	// (a step of each Lease at the last Lease's).
	StepSeconds *prometheus.HistogramVec
	// Claims is handoff_handover_claims_total{namespace,claims}.
	Claims *prometheus.CounterVec
	// LeaseReleases is
	// handoff_handover_lease_releases_total{namespace,lease,result}: the
	// Leases the pods held at shutdown, by result (released, withheld,
	// failed); lease is "" for those past the summary's bound.
	LeaseReleases *prometheus.CounterVec
	// Events is handoff_outcome_events_total{result}: ShutdownFinished
	// Events seen, by what the counter did with them.
	Events *prometheus.CounterVec
	// Leader is handoff_outcome_counter_leader: 1 while this replica holds
	// the outcome Lease and counts.
	Leader prometheus.Gauge
}

// NewMetrics makes the counter's series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Handovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "handoff_handovers_total", Help: "Shutdown sequences of the sidecars in namespace, by outcome, counted from their ShutdownFinished Events by the webhook replica that leads.",
		}, []string{"namespace", "outcome"}),
		StepSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "handoff_handover_step_seconds", Help: "Seconds from a shutdown's trigger to each step it reached, once a shutdown, from the sidecars' ShutdownFinished Events.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"namespace", "step"}),
		Claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "handoff_handover_claims_total", Help: "Claims at the sidecars' shutdowns, by kind: unstarted at stop-claiming, unfinished at the drain deadline, returned by the fallback, abandoned to the visibility timeout.",
		}, []string{"namespace", "claims"}),
		LeaseReleases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "handoff_handover_lease_releases_total", Help: "Leases held by the sidecars at their shutdowns, by result (released, withheld, failed).",
		}, []string{"namespace", "lease", "result"}),
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "handoff_outcome_events_total", Help: "ShutdownFinished Events seen by the outcome counter, by result (counted, duplicate, before_start, invalid, unsupported).",
		}, []string{"result"}),
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "handoff_outcome_counter_leader", Help: "1 while this webhook replica holds the outcome Lease and counts the handovers, else 0.",
		}),
	}
	for _, r := range []string{EventCounted, EventDuplicate, EventBeforeStart, EventInvalid, EventUnsupported} {
		m.Events.WithLabelValues(r)
	}
	reg.MustRegister(m.Handovers, m.StepSeconds, m.Claims, m.LeaseReleases, m.Events, m.Leader)
	return m
}

// DefaultDedupe is the number of Events a Counter remembers by UID.
const DefaultDedupe = 8192

// Counter counts ShutdownFinished Events into Metrics, each occurrence
// once. It remembers, by Event UID, how many occurrences it has counted
// (an Event client-go's correlator wrote again has a higher count), for
// the last dedupe Events (least recently seen forgotten first); an Event
// updated after it was forgotten is counted from its previous version's
// count, which the informer gives.
//
// It counts no Event whose last occurrence is before since (its leader's
// start less the window): those are another leader's. Of an Event first
// seen with its first occurrence before since and its last after, it
// counts one occurrence. An Event's timestamps are whole seconds (its
// firstTimestamp and lastTimestamp travel as RFC 3339 to the second): one
// is before since only if the second after it is too.
type Counter struct {
	m     *Metrics
	since time.Time
	log   logr.Logger

	mu         sync.Mutex
	seen       *lru.Cache // Event UID: occurrences counted
	namespaces map[string]bool
}

// NewCounter returns a Counter into m that counts the Events last written
// at or after since, remembering up to dedupe of them (0: DefaultDedupe).
func NewCounter(m *Metrics, since time.Time, dedupe int, log logr.Logger) *Counter {
	if dedupe <= 0 {
		dedupe = DefaultDedupe
	}
	return &Counter{m: m, since: since, log: log, seen: lru.New(dedupe), namespaces: map[string]bool{}}
}

// Observe counts e's new occurrences; old is its previous version when
// the informer has one (an update), else nil. Events of another source or
// reason are ignored. It returns the result (EventCounted, EventDuplicate,
// EventBeforeStart, EventInvalid, EventUnsupported), or "" for an ignored
// Event.
func (c *Counter) Observe(old, e *corev1.Event) string {
	if e.Reason != outcome.Reason || e.Source.Component != Source || e.InvolvedObject.Kind != "Pod" {
		return ""
	}
	count := int(max(e.Count, 1))
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	if v, ok := c.seen.Get(e.UID); ok {
		n = count - v.(int)
	} else if old != nil {
		n = count - int(max(old.Count, 1))
	} else {
		switch {
		case c.before(eventLast(e)):
		case c.before(eventFirst(e)):
			n = 1
		default:
			n = count
		}
		if n == 0 {
			c.seen.Add(e.UID, count)
			c.m.Events.WithLabelValues(EventBeforeStart).Inc()
			return EventBeforeStart
		}
	}
	if n <= 0 {
		c.m.Events.WithLabelValues(EventDuplicate).Inc()
		return EventDuplicate
	}
	c.seen.Add(e.UID, count)
	s, err := outcome.Decode(e.Annotations[outcome.Annotation])
	if err != nil {
		result := EventInvalid
		if errors.Is(err, outcome.ErrUnsupportedVersion) {
			result = EventUnsupported
		}
		c.log.Info("ShutdownFinished Event not counted", "event", e.Namespace+"/"+e.Name, "pod", e.InvolvedObject.Name, "result", result, "error", err.Error())
		c.m.Events.WithLabelValues(result).Inc()
		return result
	}
	c.count(e.Namespace, s, n)
	c.m.Events.WithLabelValues(EventCounted).Inc()
	return EventCounted
}

// count adds n occurrences of summary s in namespace ns. A namespace's
// series are made at 0 on its first summary, every outcome, step and
// claim kind, and each Lease's failed result on its first mention: a
// later increase of any is then an increase of a series Prometheus has
// already read.
func (c *Counter) count(ns string, s outcome.Summary, n int) {
	m := c.m
	if !c.namespaces[ns] {
		c.namespaces[ns] = true
		for _, o := range protocol.Outcomes() {
			m.Handovers.WithLabelValues(ns, string(o))
		}
		for _, st := range protocol.Steps() {
			m.StepSeconds.WithLabelValues(ns, string(st))
		}
		for _, k := range []string{ClaimsUnstarted, ClaimsUnfinished, ClaimsReturned, ClaimsAbandoned} {
			m.Claims.WithLabelValues(ns, k)
		}
	}
	f := float64(n)
	m.Handovers.WithLabelValues(ns, string(s.Outcome)).Add(f)
	for step, sec := range s.Steps {
		h := m.StepSeconds.WithLabelValues(ns, string(step))
		for range n {
			h.Observe(sec)
		}
	}
	for k, v := range map[string]int{ClaimsUnstarted: s.Claims.Unstarted, ClaimsUnfinished: s.Claims.Unfinished,
		ClaimsReturned: s.Claims.Returned, ClaimsAbandoned: s.Claims.Abandoned} {
		m.Claims.WithLabelValues(ns, k).Add(f * float64(v))
	}
	for _, l := range s.Leases {
		m.LeaseReleases.WithLabelValues(ns, l.Lease, outcome.ResultFailed)
		m.LeaseReleases.WithLabelValues(ns, l.Lease, l.Result).Add(f)
	}
	for r, k := range s.Unnamed {
		m.LeaseReleases.WithLabelValues(ns, "", r).Add(f * float64(k))
	}
}

// before says whether a timestamp at, to the second, is before since.
func (c *Counter) before(at time.Time) bool { return !at.Add(time.Second).After(c.since) }

// eventLast is when e last occurred: its lastTimestamp, else its
// eventTime, else its creation.
func eventLast(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// eventFirst is when e first occurred: its firstTimestamp, else eventLast.
func eventFirst(e *corev1.Event) time.Time {
	if !e.FirstTimestamp.IsZero() {
		return e.FirstTimestamp.Time
	}
	return eventLast(e)
}
