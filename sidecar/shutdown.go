package sidecar

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/internal/outcome"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

// Step names recorded in the Report, in order.
const (
	StepTriggered     = protocol.StepTriggered
	StepStopClaiming  = protocol.StepStopClaiming
	StepDrained       = protocol.StepDrained
	StepDrainDeadline = protocol.StepDrainDeadline
	StepClaimsHandled = protocol.StepClaimsHandled
	StepRevoked       = protocol.StepRevoked
	StepReleased      = protocol.StepReleased
	StepDone          = protocol.StepDone
)

const (
	// minStep is the least time any step is given, even past the deadline,
	// so that a late trigger still stops claiming and releases.
	minStep = 250 * time.Millisecond
	// maxDrainPoll bounds one long poll of the app's drain status.
	maxDrainPoll = 5 * time.Second
	// minDrainPoll is the least time from one drain poll to the next, so an
	// app that answers at once, not honouring waitMillis, is not polled in a
	// tight loop.
	minDrainPoll = 100 * time.Millisecond
	// stopClaimingTimeout bounds the stop-claiming call; the drain wait
	// then polls the app anyway.
	stopClaimingTimeout = time.Second
)

// TriggerSignal names SIGTERM to the sidecar as the trigger of a sequence;
// TriggerDeletion the pod's deletion, seen by the watch of its own object.
const (
	TriggerSignal   = protocol.TriggerSignal
	TriggerDeletion = protocol.TriggerDeletion
)

// Shutdown starts the shutdown sequence, or joins the one under way, and
// returns its report once it is over, or ctx's error if ctx ends first (the
// sequence goes on). trigger names what asked for it (prestop.TriggerPreStop
// or TriggerSignal); only the first trigger of a sequence is recorded.
//
// After a sequence in a pod that is being deleted (or one started by
// SIGTERM to the sidecar), every later trigger gets its report. After one in
// a pod that is not being deleted (a kill of the worker container for a
// restart), the coordinator re-arms, and the next trigger starts a new
// sequence. Shutdown is safe at any time, before Start too.
func (c *Coordinator) Shutdown(ctx context.Context, trigger protocol.Trigger) (*protocol.Report, error) {
	at := c.clock.Now()
	rep, err := c.shutdownAt(ctx, trigger, at)
	if rep != nil {
		// When the hook came, and when it was answered, against the sequence's own times.
		c.log.Info("shutdown joined", "trigger", trigger, "sinceSequenceStart", at.Sub(rep.Started).String(), "waited", c.clock.Since(at).String())
	}
	return rep, err
}

// shutdownAt is Shutdown for a trigger that came at at: a sequence it
// starts counts its deadline from then.
func (c *Coordinator) shutdownAt(ctx context.Context, trigger protocol.Trigger, at time.Time) (*protocol.Report, error) {
	c.mu.Lock()
	r := c.cur
	if r.restarting {
		c.mu.Unlock()
		return nil, ErrSidecarRestart
	}
	if trigger == TriggerSignal {
		// The sidecar itself is being stopped: whatever the pod, this round
		// is its last.
		r.signalled = true
	}
	if !isClosed(r.shutdown) {
		c.setPhase(PhaseShuttingDown, fmt.Sprintf("shutdown sequence under way (trigger %s): stop claiming, drain, hand the Leases over", trigger))
		close(r.shutdown)
		if !r.armed {
			// No election ever ran in this round: nothing to wait for.
			for _, l := range r.leases {
				close(l.stopped)
			}
		}
		c.metrics.Coordinating.Set(0)
		go c.runSequence(r, trigger, at)
	}
	c.mu.Unlock()
	select {
	case <-r.done:
		return r.report, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ErrSidecarRestart is returned by Signal when SIGTERM reached the sidecar
// in a pod that stays: the kubelet is restarting the sidecar container
// alone, so the worker must go on.
var ErrSidecarRestart = errors.New("SIGTERM to the sidecar in a pod that stays: worker and Leases left to the next sidecar process")

// Signal is SIGTERM to the sidecar. In a pod whose object shows it staying
// (not being deleted, not finished, not a disruption target, restartable)
// while no sequence runs, only the sidecar container is being stopped (a
// restart of the native sidecar, for its own probe): nothing is asked of
// the worker, which goes on claiming and leading until the term it was
// given ends on its own clock; every Lease is left held (WithholdRelease),
// so that the next sidecar process, with the same holder identity, renews
// it and tells the worker again; it returns ErrSidecarRestart. Otherwise,
// or when the pod cannot be read, it runs or joins the shutdown sequence
// as Shutdown(ctx, TriggerSignal) does.
//
// The decision is taken under the coordinator's lock after the pod is read:
// a sequence that a preStop started meanwhile is joined, and a preStop that
// comes once the sidecar has decided to exit is refused with
// ErrSidecarRestart (its hook then fails; the sidecar is gone a moment
// later).
func (c *Coordinator) Signal(ctx context.Context) (*protocol.Report, error) {
	// The deadline counts from the signal, not from the end of this read.
	at := c.clock.Now()
	if r := c.idleRound(); r != nil {
		if term := c.termination(c.clock.Now()); term.PodRead && !term.Leaving && c.restart(r) {
			c.log.Info("SIGTERM in a pod that stays: the worker goes on, Leases kept for the next sidecar process")
			c.event(corev1.EventTypeNormal, ReasonSidecarRestart,
				"Sidecar stopped in a pod that stays: the worker goes on; its Leases are kept for the next sidecar process")
			return nil, ErrSidecarRestart
		}
	}
	return c.shutdownAt(ctx, TriggerSignal, at)
}

// idleRound is the current round if no sequence runs or is over in it,
// else nil.
func (c *Coordinator) idleRound() *round {
	c.mu.Lock()
	defer c.mu.Unlock()
	if (c.phase == PhaseRunning || c.phase == PhaseRearming) && !isClosed(c.cur.shutdown) {
		return c.cur
	}
	return nil
}

// restart marks round r restarting and withholds its releases, unless a
// sequence has started in it since idleRound returned it, or it is no
// longer the current round (a sequence ran and re-armed meanwhile: then
// Signal joins the sequence, as it would have joined that one).
func (c *Coordinator) restart(r *round) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != r || isClosed(r.shutdown) {
		return false
	}
	r.restarting = true
	for _, l := range append(slices.Clone(r.leases), r.activeShards()...) {
		l.elector.WithholdRelease()
	}
	return true
}

// sequence is one run of the shutdown steps and its report.
type sequence struct {
	mu  sync.Mutex // guards rep's slices: Leases are released in parallel
	c   *Coordinator
	r   *round
	rep *protocol.Report
	// leases are the round's Leases and then the shards it competes for,
	// holds or sheds, taken when the sequence starts.
	leases []*lease
	b      budgets
	// instance is the app process that answered the sequence
	// (DrainStatus.Instance), "" if none said.
	instance string
	// results are the release results of rep.Leases, by index (the label
	// result of handoff_lease_releases_total), for the ShutdownFinished
	// Event's summary.
	results []string
	// hops are the times of each released Lease's step 5, by Lease name,
	// for the summary.
	hops map[string]outcome.LeaseHops
}

// runSequence is the shutdown sequence, step by step, in the manner of
// controller-runtime's engageStopProcedure: every wait below is bounded by
// the budgets planned once from the deadline (q.b).
//
// Its steps are numbered as in docs/architecture.md ("The shutdown
// sequence") and every comment of this package: 1 the deadline, 2 stop
// claiming, 3 wait for the drain, 4 the fallback, 5 revoke leadership and
// release the Leases, 6 answer the hook. The numbers name the steps, not
// the order of the calls: step 2's call is sent before step 1's read of
// the pod returns, and the role Leases' step 5 runs beside steps 3 and 4.
func (c *Coordinator) runSequence(r *round, trigger protocol.Trigger, at time.Time) {
	q := &sequence{c: c, r: r, rep: &protocol.Report{Trigger: trigger, Started: at}, hops: map[string]outcome.LeaseHops{}}
	// The shard set's loop has stopped with the trigger: its elections join the round's.
	q.leases = append(slices.Clone(r.leases), c.shardLeases(r)...)
	// Step 5's successors, looked up first, beside all the rest (the log line, the standbys' locks,
	// the revoke): each release names the pod that stays to take it, and waits for the pick.
	r.successors.p.Store(c.findSuccessors(q.heldLeases()))
	q.step(StepTriggered, string(trigger))

	// A pod that is leaving takes no Lease it does not hold.
	q.stopStandbys()
	// Step 2, stop claiming, sent at once: it needs no deadline, and reading the pod may be slow.
	stopped := q.stopClaiming()
	// Step 1, the deadline, from the pod's own object: its deletion, or the grace period of the kill.
	term := q.readDeadline()
	// Step 5 for the roles now, beside the drain: a singleton job must not wait for the slowest claim (revoke, ack, release).
	roles := q.releaseLeases(protocol.LeaseKindRole)
	// Steps 3 and 4: drain until the deadline less the reserve, then the fallback for what is left.
	q.handleClaims(<-stopped)
	// Step 5 for the partitions, after the drain: a successor must not claim work this pod still does.
	q.releaseLeases(protocol.LeaseKindPartition).Wait()
	roles.Wait()
	// Step 6: the report answers the hook; the kubelet then sends SIGTERM to the worker.
	q.finish()
	// A kill of the worker container in a pod that stays re-arms: the kubelet restarts it.
	c.endRound(r, q.rep, term.Leaving, q.instance)
}

// stopClaiming sends step 2: it tells the app to stop claiming, in the
// background; the answer comes on the channel (handleClaims records it).
func (q *sequence) stopClaiming() <-chan stopResult {
	stopped := make(chan stopResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopClaimingTimeout)
		defer cancel()
		start := q.c.clock.Now()
		st, err := q.c.app.StopClaiming(ctx)
		stopped <- stopResult{st, err, q.c.clock.Since(start)}
	}()
	return stopped
}

// readDeadline is step 1: it reads the pod, plans the budgets from its
// deadline, and logs them.
func (q *sequence) readDeadline() prestop.Termination {
	c := q.c
	term := c.termination(q.rep.Started)
	q.b = plan(c.s, q.rep.Started, term.Deadline)
	q.rep.Deadline, q.rep.DeadlineSource = term.Deadline, term.Source
	c.log.Info("shutdown started", append([]any{"trigger", q.rep.Trigger, "deadlineSource", term.Source,
		"round", q.r.n, "podLeaving", term.Leaving, "why", term.Why}, q.b.logValues()...)...)
	return term
}

// finish closes the report: step 6, whose report answers the hook (every
// trigger waiting in Shutdown gets it).
func (q *sequence) finish() {
	c := q.c
	q.rep.Finished = c.clock.Now()
	q.step(StepDone, string(q.rep.Outcome))
	c.metrics.Shutdowns.WithLabelValues(string(q.rep.Outcome)).Inc()
	q.recordFinished()
	c.log.Info("shutdown finished", "outcome", q.rep.Outcome, "took", q.rep.Finished.Sub(q.rep.Started).String(),
		"returned", q.rep.Returned, "abandoned", q.rep.Abandoned, "beforeDeadline", q.rep.Finished.Before(q.rep.Deadline))
}

// recordFinished records the ShutdownFinished Event on the pod, with the
// sequence's outcome, steps, claims and Lease results in its annotation
// (outcome.Summary): the webhook's outcome counter counts handovers from
// it, so the pod need not stay for a scrape of its own metrics. A Warning
// when claims were abandoned or a step failed.
func (q *sequence) recordFinished() {
	c := q.c
	if c.events == nil {
		return
	}
	q.mu.Lock()
	s := outcome.FromReport(q.rep, q.results).WithHops(q.rep.Started, q.lateHops())
	q.mu.Unlock()
	eventtype := corev1.EventTypeNormal
	if q.rep.Outcome == protocol.OutcomeAbandoned || len(q.rep.Errors) > 0 {
		eventtype = corev1.EventTypeWarning
	}
	c.events.AnnotatedEventf(c.pod, map[string]string{outcome.Annotation: s.Encode()}, eventtype, ReasonShutdownFinished,
		"%s", s.Message(q.rep.Started, q.rep.Finished.Sub(q.rep.Started)))
}

// endRound records the report of r's sequence and either re-arms (a new
// round, waiting for a new worker process) or stays done: when the pod is
// leaving (at the trigger, or now), when SIGTERM to the sidecar joined the
// sequence, or when Start's context has ended.
func (c *Coordinator) endRound(r *round, rep *protocol.Report, leavingAtTrigger bool, instance string) {
	c.mu.Lock()
	signalled := r.signalled
	c.mu.Unlock()
	// A round that cannot re-arm needs no second read of the pod: it would
	// only delay the hook's answer.
	leaving := leavingAtTrigger || signalled || c.termination(c.clock.Now()).Leaving
	c.mu.Lock()
	rearm := !leaving && !r.signalled && c.base.Err() == nil
	r.report, c.last = rep, rep
	c.setPhase(PhaseDone, fmt.Sprintf("last shutdown sequence over (outcome %s): the pod is leaving", rep.Outcome))
	var next *round
	if rearm {
		var err error
		if next, err = c.newRound(); err != nil { // validated in New
			panic(err)
		}
		next.drained = instance // the process being killed: not a new one
		c.cur = next
		c.setPhase(PhaseRearming, fmt.Sprintf("shutdown sequence over (outcome %s) in a pod that stays: elections wait for a new worker process", rep.Outcome))
	}
	c.mu.Unlock()
	close(r.done)
	if next != nil {
		go c.rearm(next)
	}
}

// podReadTimeout bounds each read of the pod from the API, when the watch
// cannot answer.
const podReadTimeout = 2 * time.Second

// termination reads the pod (from the watch, else a bounded GET) and says
// what it tells of a trigger at now. A pod the watch shows not being deleted
// is read once more from the API: the kubelet, which sent the preStop, may
// have seen the deletion before this watch did.
func (c *Coordinator) termination(now time.Time) prestop.Termination {
	var pod *corev1.Pod
	if c.pods != nil {
		p, from, err := c.pods.Pod(context.Background(), podReadTimeout)
		if err == nil && from == prestop.FromWatch && p.DeletionTimestamp == nil {
			if fresh, gerr := c.pods.Get(context.Background(), podReadTimeout); gerr == nil {
				p = fresh
			}
		}
		if err != nil {
			c.log.Info("pod not read: deadline from the grace period", "from", from, "reason", err.Error())
		}
		pod = p
	}
	return prestop.TerminationOf(pod, c.s.WorkerContainer, now, c.s.GracePeriod, c.s.DeadlineMargin)
}

// noteInstance keeps the app instance of the latest answer that named one.
func (q *sequence) noteInstance(instance string) {
	if instance != "" {
		q.instance = instance
	}
}

// stopResult is the app's answer to stop-claiming.
type stopResult struct {
	st   protocol.DrainStatus
	err  error
	took time.Duration // from the call to its answer
}

// handleClaims records the answer to stop-claiming (step 2), waits for
// drained until the drain budget ends (step 3), then applies the fallback
// (step 4).
func (q *sequence) handleClaims(stop stopResult) {
	c := q.c
	st, err := stop.st, stop.err
	q.noteInstance(st.Instance)
	c.metrics.appResult("stop-claiming", stop.took, err)
	if protocol.IsAppGone(err) {
		q.rep.Outcome = protocol.OutcomeAppGone
		q.step(StepStopClaiming, "app not running: nothing to drain")
		return
	}
	if err != nil {
		q.fail("stop-claiming: %v", err)
	}
	// Unstarted claims are the app's to hand back at once (DrainStatus.Unstarted).
	q.rep.UnstartedAtStopClaiming = st.Unstarted
	c.metrics.ClaimsUnstarted.Add(float64(st.Unstarted))
	q.step(StepStopClaiming, fmt.Sprintf("%d in flight, %d of them unstarted", st.InFlight, st.Unstarted))
	c.event(corev1.EventTypeNormal, ReasonDrainStarted, "Stopped claiming with %d in flight (%d unstarted, handed back by the app at once); drain until %s, fallback %s",
		st.InFlight, st.Unstarted, q.b.DrainBy.Format(time.RFC3339Nano), c.s.Fallback)

	// Step 3: wait for drained. st keeps the last status the app gave.
	drained := err == nil && st.Drained
	stopping := err == nil && st.Stopping
	clk := c.clock
	for !drained && clk.Now().Before(q.b.DrainBy) {
		polled := clk.Now()
		if !stopping {
			// Stop-claiming failed or timed out, or the app says it still
			// claims: ask again, each time bounded as the first.
			sctx, scancel := context.WithTimeout(context.Background(), min(stopClaimingTimeout, max(q.b.DrainBy.Sub(polled), minStep)))
			answer, err := c.app.StopClaiming(sctx)
			scancel()
			c.metrics.appResult("stop-claiming", clk.Since(polled), err)
			if err == nil {
				st, stopping, drained = answer, answer.Stopping, answer.Drained
				q.noteInstance(answer.Instance)
			}
			if drained {
				break
			}
		}
		wait := min(q.b.DrainBy.Sub(polled), maxDrainPoll)
		ctx, cancel := context.WithTimeout(context.Background(), wait+time.Second)
		asked := clk.Now()
		answer, err := c.app.Drain(ctx, wait)
		cancel()
		c.metrics.appResult("drain", clk.Since(asked), err)
		switch {
		case protocol.IsAppGone(err):
			// Whatever it still held is left to the visibility timeout:
			// the last count it reported.
			q.rep.Outcome, q.rep.Abandoned = protocol.OutcomeAppGone, st.InFlight
			q.step(StepDrained, fmt.Sprintf("app exited with %d in flight", st.InFlight))
			return
		case err != nil:
			c.log.V(1).Info("drain status", "error", err.Error())
		default:
			st, drained, stopping = answer, answer.Drained, answer.Stopping
			q.noteInstance(answer.Instance)
		}
		if !drained {
			// Paced: at most one poll per minDrainPoll, whatever the app does.
			now := clk.Now()
			clk.Sleep(min(polled.Add(minDrainPoll).Sub(now), max(q.b.DrainBy.Sub(now), 0)))
		}
	}
	if drained {
		q.rep.Outcome = protocol.OutcomeDrained
		q.step(StepDrained, "")
		c.event(corev1.EventTypeNormal, ReasonDrained, "Drained in %s", clk.Since(q.rep.Started).Round(time.Millisecond))
		return
	}

	// Step 4: the drain deadline passed with work in flight: the fallback.
	q.rep.InFlightAtDeadline = st.InFlight
	c.metrics.ClaimsLeft.Add(float64(st.InFlight))
	q.step(StepDrainDeadline, fmt.Sprintf("%d in flight", st.InFlight))
	if c.s.Fallback == config.FallbackAbandon {
		q.rep.Outcome, q.rep.Abandoned = protocol.OutcomeAbandoned, st.InFlight
		c.event(corev1.EventTypeWarning, ReasonDeadlineExceeded,
			"Drain deadline exceeded with %d claims in flight; fallback abandon: left to the visibility timeout", st.InFlight)
		return
	}
	q.rep.Outcome = protocol.OutcomeReturned
	if c.s.Fallback == config.FallbackCancel {
		q.rep.Outcome = protocol.OutcomeCanceled
	}
	budget := q.b.left(clk.Now(), q.b.FallbackBy)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	// Half the budget for canceled work to end, half to hand claims back.
	asked := clk.Now()
	res, err := c.app.Return(ctx, c.s.Fallback == config.FallbackCancel, budget/2)
	cancel()
	c.metrics.appResult("return", clk.Since(asked), err)
	if err == nil && res.Error != "" {
		err = fmt.Errorf("%s", res.Error)
	}
	if err != nil {
		q.fail("returning claims: %v", err)
	}
	q.rep.Returned = res.Returned
	c.metrics.ClaimsReturned.Add(float64(res.Returned))
	q.step(StepClaimsHandled, fmt.Sprintf("%s: %d returned", c.s.Fallback, res.Returned))
	c.event(corev1.EventTypeWarning, ReasonDeadlineExceeded,
		"Drain deadline exceeded with %d claims in flight; fallback %s: %d returned%s",
		st.InFlight, c.s.Fallback, res.Returned, errSuffix(err))
}

// heldLeases names the Leases of the sequence this pod holds, but for the
// shards: only the peer a shard is assigned to competes for it.
func (q *sequence) heldLeases() []string {
	var names []string
	for _, l := range q.leases {
		if _, leader := l.elector.Term(); leader && !slices.Contains(q.c.s.Shards, l.elector.Name()) {
			names = append(names, l.elector.Name())
		}
	}
	return names
}

// stopStandbys ends the elections this pod does not lead and never told the
// app it led: a pod that is leaving must not take a Lease (part of step 2:
// from here the pod takes nothing new).
func (q *sequence) stopStandbys() {
	for _, l := range q.leases {
		l.mu.Lock()
		if _, leader := l.elector.Term(); !leader && l.granted.IsZero() {
			l.revoked = true
			l.cancel()
		}
		l.mu.Unlock()
	}
}

// releaseLeases runs step 5 for every Lease of kind at once, in the
// background (Wait waits for them): the app's leader work stops (its ack),
// then client-go releases the Lease on cancel. A Lease whose revoke was not
// acknowledged is released only once the term the app was given has run
// out, or else left to expire. Each result goes to its place in the
// report's Leases, in the configured order.
func (q *sequence) releaseLeases(kind protocol.LeaseKind) *sync.WaitGroup {
	q.mu.Lock()
	if q.rep.Leases == nil {
		q.rep.Leases = make([]protocol.LeaseRelease, len(q.leases))
		q.results = make([]string, len(q.leases))
	}
	q.mu.Unlock()
	var wg sync.WaitGroup
	for i, l := range q.leases {
		if l.kind != kind {
			continue
		}
		wg.Go(func() {
			r, result, hops := q.release(l)
			q.mu.Lock()
			q.rep.Leases[i], q.results[i] = r, result
			if r.WasLeader {
				q.hops[r.Lease] = hops
			}
			q.mu.Unlock()
			if r.WasLeader {
				q.step(StepReleased, strings.TrimSpace(fmt.Sprintf("%s (%s): released=%t %s", r.Lease, r.Kind, r.Released, r.Detail)))
			}
		})
	}
	return &wg
}

// release is step 5 for one Lease: revoke the app's leadership and wait
// for its ack (bounded by RevokeBy and the term the app was given), then
// release the Lease through client-go (bounded by ReleaseBy), freeing a
// leftover on a second write; it records the result's Event and metric,
// and returns the result with it (ReleaseReleased, ReleaseWithheld,
// ReleaseFailed or ReleaseNotLeader) and the times of its hops.
func (q *sequence) release(l *lease) (protocol.LeaseRelease, string, outcome.LeaseHops) {
	c := q.c
	name := l.elector.Name()
	_, leader := l.elector.Term()
	r := protocol.LeaseRelease{Lease: name, Kind: l.kind, WasLeader: leader}
	hops := outcome.LeaseHops{At: map[outcome.Hop]time.Time{}}

	l.mu.Lock()
	l.revoked = true
	granted := l.granted
	clk := c.clock
	if !granted.IsZero() && clk.Now().Before(granted) {
		// No use waiting for an ack past the end of the app's term.
		asked := clk.Now()
		hops.At[outcome.HopRevokeSent] = asked
		ctx, cancel := context.WithTimeout(context.Background(), q.b.left(asked, minTime(q.b.RevokeBy, granted)))
		err := c.app.SetLeadership(ctx, protocol.Leadership{Lease: name, Leader: false, Sequence: l.nextSequence()})
		cancel()
		c.metrics.appResult("revoke", clk.Since(asked), err)
		if err == nil || protocol.IsAppGone(err) {
			hops.At[outcome.HopRevokeAcked] = clk.Now()
			granted = time.Time{}
			q.step(StepRevoked, name)
		} else {
			q.fail("revoking leadership of %s: %v", name, err)
		}
	}
	l.mu.Unlock()

	withheld := false
	if !granted.IsZero() {
		if wait := granted.Sub(clk.Now()); wait > 0 && granted.Before(q.b.ReleaseBy) {
			r.Detail = fmt.Sprintf("waited %s for the app's term to end", wait.Round(time.Millisecond))
			clk.Sleep(wait)
		} else if wait > 0 {
			l.elector.WithholdRelease()
			withheld = true
			r.Detail = "app did not confirm leader work stopped: left to expire"
		}
	}
	s := q.r.successors.p.Load()
	if leader && s != nil && s.wants(name) {
		// The release names the successor: give its lookup until pickWait from the trigger if it is late.
		s.wait(q.b.left(clk.Now(), q.b.ReleaseBy))
		if at, ok := s.ended(); ok {
			hops.At[outcome.HopSuccessorPicked] = at
		} else {
			hops.At[outcome.HopSuccessorGivenUp] = clk.Now()
		}
	}
	l.cancel()
	ended := true
	select {
	case <-l.stopped:
	case <-clk.After(q.b.left(clk.Now(), q.b.ReleaseBy)):
		ended = false
		r.Detail = "release not confirmed by the deadline"
	}
	r.Released = l.elector.Released()
	// An election that never ran (a round never armed: its sequence came
	// before a new worker process answered) left nothing: a Lease naming
	// the pod is the last round's, withheld for a process that never
	// confirmed its leader work stopped; only the re-arm frees it, once
	// that process is gone.
	c.mu.Lock()
	ran := q.r.armed
	c.mu.Unlock()
	switch {
	case r.Released && !leader:
		// A standby's acquiring write answered after the stop: it led, only to release.
		leader, r.WasLeader = true, true
		r.Detail = "won by a write answered after the stop, and released"
	case !r.Released && !withheld && ended && ran:
		// A release write that failed, or an acquiring write whose answer was
		// lost: the Lease may still name the pod. Free it within the budget.
		ctx, cancel := context.WithTimeout(context.Background(), q.b.left(clk.Now(), q.b.ReleaseBy))
		freed, free, err := c.releaseLeftoverRead(ctx, name)
		cancel()
		switch {
		case freed:
			r.Detail = "freed on a second write: it still named this pod after its election ended" + errSuffix(l.elector.ReleaseErr())
			r.Released, leader, r.WasLeader = true, true, true
		case free && leader:
			// The release write landed, its answer lost: the Lease is free.
			r.Detail = "read free after its release write" + errSuffix(l.elector.ReleaseErr())
			r.Released = true
		case err != nil && leader:
			r.Detail = fmt.Sprintf("%v; read again to free it: %v", l.elector.ReleaseErr(), err)
		case err != nil && l.elector.MayHold():
			// A write of its record whose answer was lost may have won the
			// Lease, and it could not be read: it may name the pod until it
			// expires. A failure, as a release not done.
			leader, r.WasLeader = true, true
			r.Detail = fmt.Sprintf("a write of this pod's record may have won it (its answer lost); read to free it: %v", err)
		}
	}
	if r.Released {
		r.ReleasedAt = clk.Now()
		l.releasedAt.Store(r.ReleasedAt)
	}
	for hop, at := range map[outcome.Hop]*atomic.Pointer[time.Time]{outcome.HopReleaseSent: &l.releaseSent, outcome.HopReleaseAcked: &l.releaseAcked} {
		if t := at.Load(); t != nil && !t.Before(q.rep.Started) {
			hops.At[hop] = *t
		}
	}
	named := ""
	if n := l.named.Load(); n != nil {
		named = *n
	}
	if s != nil && s.wants(name) {
		hops.Successor = successorResult(s, named, hops)
	}
	result := ReleaseReleased
	switch {
	case !leader:
		result = ReleaseNotLeader
	case r.Released:
		successor := ""
		if named != "" {
			successor = ", naming successor " + named
		}
		c.event(corev1.EventTypeNormal, ReasonLeaseReleased, "Lease %s (%s) released at %s, %s after the shutdown started%s; from the start: %s",
			name, l.kind, r.ReleasedAt.Format(time.RFC3339Nano), r.ReleasedAt.Sub(q.rep.Started).Round(time.Millisecond), successor, hopsText(q.rep.Started, hops))
	case withheld:
		result = ReleaseWithheld
		c.event(corev1.EventTypeWarning, ReasonReleaseWithheld, "Lease %s not released: %s", name, r.Detail)
	default:
		// A release that did not happen is a failure of the sequence: the
		// report carries it, so the hook exits non-zero.
		result = ReleaseFailed
		if err := l.elector.ReleaseErr(); err != nil && r.Detail == "" {
			r.Detail = err.Error()
		}
		q.fail("releasing Lease %s: %s", name, r.Detail)
		c.event(corev1.EventTypeWarning, ReasonHandoverFailed, "Lease %s not released: %s", name, r.Detail)
	}
	c.metrics.Releases.WithLabelValues(name, result).Inc()
	return r, result, hops
}

// successorResult is what the release write of a Lease whose successor s
// looked for named (outcome.Successors): named is what it named, hops its
// hops so far.
func successorResult(s *successors, named string, hops outcome.LeaseHops) string {
	_, gaveUp := hops.At[outcome.HopSuccessorGivenUp]
	_, done := s.ended()
	switch {
	case named != "":
		return outcome.SuccessorNamed
	case gaveUp || !done:
		return outcome.SuccessorLate
	case s.err != nil:
		return outcome.SuccessorFailed
	}
	return outcome.SuccessorNone
}

// lateHops are the sequence's hops with the end of a pick that came after
// its release gave up on it; q.mu is held.
func (q *sequence) lateHops() map[string]outcome.LeaseHops {
	s := q.r.successors.p.Load()
	if s == nil {
		return q.hops
	}
	at, ok := s.ended()
	if !ok {
		return q.hops
	}
	for _, h := range q.hops {
		if _, gaveUp := h.At[outcome.HopSuccessorGivenUp]; gaveUp {
			h.At[outcome.HopSuccessorPicked] = at
		}
	}
	return q.hops
}

// hopsText is hops in words, each in milliseconds from started, in the
// order a handover passes them: "revoke sent +0.21 ms, revoke acked +1.93
// ms, ...".
func hopsText(started time.Time, hops outcome.LeaseHops) string {
	var parts []string
	for _, h := range outcome.Hops() {
		if at, ok := hops.At[h]; ok {
			parts = append(parts, fmt.Sprintf("%s %+.2f ms", strings.ReplaceAll(string(h), "-", " "), float64(at.Sub(started).Microseconds())/1000))
		}
	}
	if len(parts) == 0 {
		return "no hops recorded"
	}
	return strings.Join(parts, ", ")
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return "; error: " + err.Error()
}

func (q *sequence) step(name protocol.StepName, detail string) {
	now := q.c.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rep.Steps = append(q.rep.Steps, protocol.Step{Name: name, At: now, Detail: detail})
	q.c.metrics.StepSeconds.WithLabelValues(string(name)).Observe(now.Sub(q.rep.Started).Seconds())
	q.c.log.Info("shutdown step", "step", name, "detail", detail, "sinceTrigger", now.Sub(q.rep.Started).String())
}

func (q *sequence) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rep.Errors = append(q.rep.Errors, msg)
	q.c.log.Info("shutdown step failed", "error", msg)
}
