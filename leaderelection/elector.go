// Package leaderelection runs handoff's Lease elections on client-go's
// tools/leaderelection with a LeaseLock and ReleaseOnCancel. It adds what the
// app needs to act safely as leader: a term that ends on the app's own clock
// before any other candidate could take the Lease, and a fencing token.
//
// What it guarantees, for candidates with the same timings whose clocks
// drift apart, over a lease duration, by less than the lease duration less
// TermLength (no synchronized clocks are needed: each candidate times the
// Lease on its own):
//   - A term's Until (a renewal's start plus TermLength) is before any
//     other candidate can take the Lease.
//   - Each new holder gets a greater fencing token (the Lease's
//     spec.leaseTransitions), after a release as after an expiry.
//   - When Run's context ends, a held Lease is released (empty holder
//     identity) unless WithholdRelease was called, and an acquiring write
//     already sent is answered, not abandoned: a Lease it won is released
//     too. Each request is bounded (RequestTimeout), so Run returns within
//     a few of them.
//   - A release whose Config.Successor names a candidate is taken by that
//     candidate first when its watch is up: the others hold back for
//     SuccessorGrace (AnnotationSuccessor).
//
// What it does not guarantee:
//   - That the Lease is free when Run returns: a release write that fails
//     (Released, ReleaseErr) leaves the Lease to expire a lease duration
//     after its last renewal; ReleaseLeftover frees such a Lease later.
//   - That two candidates of one holder identity are told apart: a
//     candidate renews a Lease that names its identity as its own.
//   - Anything against a candidate with a shorter lease duration, or a
//     clock that drifts past that margin.
//   - That the named successor leads: gone, or not a candidate, it leaves
//     the Lease free for SuccessorGrace before the others compete; and a
//     standby whose watch is down (polling) does not hold back.
package leaderelection

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
)

// ErrReleaseWithheld is returned to client-go's elector in place of the
// release write when WithholdRelease was called: the Lease is then left to
// expire after its lease duration.
var ErrReleaseWithheld = errors.New("release withheld: the app did not confirm its leader work stopped")

// Config describes one Lease election.
type Config struct {
	// Leases and Core are the API clients; Core may be nil (it is only used
	// by client-go for lock events, which handoff does not record).
	Leases coordinationv1client.LeasesGetter
	Core   corev1client.CoreV1Interface
	// Namespace and Name of the Lease; Identity is the holder identity.
	Namespace, Name, Identity string
	// LeaseDuration, RenewDeadline, RetryPeriod as in client-go.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Logger                                    logr.Logger
	// Clock is the clock of the term (Term's Until and its expiry, the time
	// a holder gives up taking over the Lease its standby won) and of a
	// standby's waits; nil is clock.RealClock. client-go's elector keeps
	// the real clock for its own retries and record stamps: its config
	// takes no clock.
	Clock clock.Clock
	// Trace, if set, is called at each Hop of a release and of a takeover,
	// on the goroutine that reaches it, for measurement (bench/takeover
	// takes the time in it; the sidecar, the times of its release write
	// for its shutdown summary); it must not block. nil: each hop then
	// costs a nil check.
	Trace func(Hop)
	// Successor, if set, is called once per release write, just before it
	// is sent, for the holder identity of the candidate this holder
	// prefers to take the Lease next (AnnotationSuccessor), or "" for none;
	// it must not block. The others hold back for SuccessorGrace. nil names
	// none: every standby competes at once.
	Successor func() string
}

// maxReleaseWrites bounds the release writes of one release: client-go
// re-reads the Lease and writes again after each conflict (409: something
// else wrote the Lease since the read, such as a late renewal or a tool
// adding a label) until its release context of one renew deadline ends.
const maxReleaseWrites = 5

// Term is one tenure as holder of a Lease.
type Term struct {
	Lease string
	// FencingToken is the Lease's spec.leaseTransitions when this holder
	// acquired it; each new holder gets a greater one.
	FencingToken int64
	// Until is when the holder must stop acting as leader unless renewed, on
	// the local clock: the start of the last successful renewal plus
	// TermLength. Another candidate can take the Lease no earlier.
	Until time.Time
}

// TermLength is how long after the start of a successful renewal the holder
// may act as leader: the renew deadline, capped at the lease duration in
// whole seconds less one second. The cap is client-go's, not a choice: the
// Lease record holds its duration in whole seconds, and a standby restarts
// its expiry clock only when the record it reads changes, which, with times
// compared at one-second resolution, may be up to a second before the last
// renewal. A standby therefore takes the Lease no earlier than the renewal's
// second plus the whole-second lease duration, and a term of this length
// ends before that.
func TermLength(leaseDuration, renewDeadline time.Duration) time.Duration {
	return min(renewDeadline, leaseDuration.Truncate(time.Second)-time.Second)
}

// Callbacks are called from the election goroutine; they must not block.
type Callbacks struct {
	// OnTerm is called when this candidate acquires the Lease and on every
	// successful renewal after, with Until moved on.
	OnTerm func(Term)
	// OnStopped is called when a term ends: leadership lost, or released.
	OnStopped func()
	// OnNewLeader is called when the observed holder identity changes.
	OnNewLeader func(identity string)
}

// Elector competes for one Lease until its context ends.
type Elector struct {
	cfg Config
	cb  Callbacks

	mu       sync.Mutex
	term     *Term // nil once the term has ended, even before client-go notices
	leading  bool  // between the first write of our record and OnStoppedLeading
	holder   string
	withhold bool
	released bool
	// releaseErr is why the last release was not written; nil after a
	// written release, or when no release was attempted.
	releaseErr error
	// unsure: the last write of this candidate's record failed other than
	// by a conflict, so it may have landed (its answer lost).
	unsure bool
}

// New validates cfg and returns an Elector. It returns the error of
// client-go's own validation of the timings when they are inconsistent.
func New(cfg Config, cb Callbacks) (*Elector, error) {
	if cfg.Name == "" || cfg.Namespace == "" || cfg.Identity == "" {
		return nil, fmt.Errorf("lease name, namespace and identity are required (got %q/%q, identity %q)", cfg.Namespace, cfg.Name, cfg.Identity)
	}
	if TermLength(cfg.LeaseDuration, cfg.RenewDeadline) <= 0 {
		return nil, fmt.Errorf("lease %s/%s: lease duration %s leaves no term (the whole seconds of the lease duration less 1s must be positive); want at least 2s",
			cfg.Namespace, cfg.Name, cfg.LeaseDuration)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	e := &Elector{cfg: cfg, cb: cb}
	for _, retryPeriod := range []time.Duration{cfg.RetryPeriod, wakePeriod} {
		if _, err := e.leaderElector(&rl.LeaseLock{LockConfig: rl.ResourceLockConfig{Identity: cfg.Identity}}, retryPeriod, true, func(context.Context) {}); err != nil {
			return nil, fmt.Errorf("lease %s/%s: %w", cfg.Namespace, cfg.Name, err)
		}
	}
	return e, nil
}

// Name is the Lease's name.
func (e *Elector) Name() string { return e.cfg.Name }

// Run competes for the Lease until ctx is done. As a standby it watches the
// Lease and tries to acquire it the moment the holder releases it or its
// lease duration runs out (polling every retry period while the watch is
// down); as holder it renews every retry period. When ctx ends while it
// holds the Lease it releases it (empty holder identity, client-go's
// ReleaseOnCancel) before returning, unless WithholdRelease was called; an
// acquiring write already sent when ctx ends is not cut but answered
// (within the renew deadline), and a Lease it won is released the same way.
// After losing the Lease it competes again.
//
// Both phases are client-go's LeaderElector on a LeaseLock: the standby's
// with a short retry period over a client whose Gets wait on the watch, the
// holder's with the configured timings. The holder's elector takes over the
// Lease the standby's acquired, as client-go does for its own identity.
// The watch lasts only as long as the standby phase: a holder reads
// nothing from it, and each open watch is one more watcher the apiserver
// sends every renewal to. A standby phase after a lost Lease opens a new
// one. Run returns once its watches have ended.
func (e *Elector) Run(ctx context.Context) {
	var watches sync.WaitGroup
	defer watches.Wait()
	// Real time, as client-go's elector's retries: the skipped writes are
	// the ones client-go sends right after the acquisition, by its clock.
	own := &ownWrite{clock: clock.RealClock{}}
	for ctx.Err() == nil {
		w := newLeaseWatch(e.cfg.Leases.Leases(e.cfg.Namespace), e.cfg.Namespace, e.cfg.Name, e.cfg.Trace)
		wctx, stop := context.WithCancel(ctx)
		watches.Go(func() { w.run(wctx) })
		acquired := e.standby(ctx, w, own)
		stop()
		if acquired {
			e.lead(ctx, own)
		}
	}
}

// standby runs client-go's elector on the watched Lease until it acquires
// the Lease (true) or ctx ends (false). Its writes are recorded in own.
func (e *Elector) standby(ctx context.Context, w *leaseWatch, own *ownWrite) bool {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	acquired := false
	lock := &observedLock{
		// Its Gets wait on the watch, unbounded; the reads and writes it
		// sends to the API are bounded per request.
		Interface: e.leaseLock(&watchedLeases{LeasesGetter: ownLeases{LeasesGetter: e.bounded(), own: own, identity: e.cfg.Identity}, watch: w, identity: e.cfg.Identity, retryPeriod: e.cfg.RetryPeriod, writeTimeout: e.cfg.RenewDeadline, clock: e.cfg.Clock, trace: e.cfg.Trace}),
		e:         e,
		restamp:   true,
		// Stop before client-go's first renewal at the short retry period:
		// the holder's elector renews from here.
		acquired: func() { acquired = true; cancel() },
	}
	le, err := e.leaderElector(lock, wakePeriod, false, func(context.Context) {})
	if err != nil { // validated in New
		panic(err)
	}
	le.Run(ctx)
	return acquired
}

// lead runs client-go's elector with the configured timings over the Lease
// the standby phase has just acquired, until the Lease is lost or, once
// held, ctx ends and it is released. If it does not hold the Lease before
// the term the standby phase won runs out, it gives up.
//
// It sends no request for what it already knows. client-go's elector
// starts with no observed record: it reads the Lease, writes it, and at
// once writes it again as its first renewal. Here the read is answered
// from the standby phase's acquiring write (own), and the two writes, sent
// less than half a retry period after that one and changing nothing but
// the renew time, are skipped (observedLock.Update): the term stays counted
// from the write that was sent, and the first renewal sent is the one a
// retry period later. Likewise the read of client-go's release is
// answered from the last renewal, so a release is one write.
func (e *Elector) lead(ctx context.Context, own *ownWrite) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	started := make(chan struct{})
	lock := &observedLock{Interface: e.leaseLock(ownLeases{LeasesGetter: e.bounded(), own: own, answer: true, identity: e.cfg.Identity, successor: e.cfg.Successor}), e: e, own: own, skipWithin: e.cfg.RetryPeriod / 2}
	le, err := e.leaderElector(lock, e.cfg.RetryPeriod, true, func(context.Context) { close(started) })
	if err != nil { // validated in New
		panic(err)
	}
	term, _ := e.Term()
	go func() {
		giveUp := e.cfg.Clock.NewTimer(term.Until.Sub(e.cfg.Clock.Now()))
		defer giveUp.Stop()
		select {
		case <-started: // then a cancel releases the Lease
			select {
			case <-ctx.Done():
				cancel()
			case <-runCtx.Done():
			}
		case <-giveUp.C():
			cancel()
		case <-runCtx.Done():
		}
	}()
	le.Run(runCtx)
	select {
	case <-started:
		lock.unwritten(true)
	default: // client-go releases only after leading
		lock.unwritten(false)
	}
}

// Term returns the current term, and false when this candidate does not
// hold the Lease or its term has run out on the local clock.
func (e *Elector) Term() (Term, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.term == nil || !e.cfg.Clock.Now().Before(e.term.Until) {
		return Term{}, false
	}
	return *e.term, true
}

// Holder is the holder identity last observed, "" when none.
func (e *Elector) Holder() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.holder
}

// WithholdRelease makes the release at the end of Run fail with
// ErrReleaseWithheld, so the Lease expires instead of being freed at once.
func (e *Elector) WithholdRelease() {
	e.mu.Lock()
	e.withhold = true
	e.mu.Unlock()
}

// MayHold reports whether the last write of this candidate's record
// failed other than by a conflict (a timeout, a cut connection): it may
// have landed with its answer lost, and the Lease may name this candidate
// though it never learnt it.
func (e *Elector) MayHold() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.unsure
}

// Released reports whether this Elector wrote the release of the Lease.
func (e *Elector) Released() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.released
}

// ReleaseErr is why the last term's Lease was not released: nil after a
// written release, while a term lasts, or when this candidate never held
// the Lease; ErrReleaseWithheld after WithholdRelease; else, in words
// beginning "not released:", the refusal (the Lease names another holder),
// the API error of the read before the write or of the write, the conflicts
// that used up the few release writes, or the failed renewal that ended a
// term the holder's elector never renewed.
func (e *Elector) ReleaseErr() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.releaseErr
}

// bounded is the Leases client with each Get, Create and Update bounded by
// RequestTimeout; the watch of the Lease uses e.cfg.Leases, unbounded.
func (e *Elector) bounded() coordinationv1client.LeasesGetter {
	return boundedLeases{LeasesGetter: e.cfg.Leases, timeout: RequestTimeout(e.cfg.RenewDeadline)}
}

func (e *Elector) leaseLock(leases coordinationv1client.LeasesGetter) *rl.LeaseLock {
	return &rl.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.cfg.Namespace, Name: e.cfg.Name},
		Client:     leases,
		LockConfig: rl.ResourceLockConfig{Identity: e.cfg.Identity},
	}
}

func (e *Elector) leaderElector(lock rl.Interface, retryPeriod time.Duration, holder bool, started func(context.Context)) (*leaderelection.LeaderElector, error) {
	stopped := e.stopped
	if !holder {
		stopped = func() {} // leadership, if won, goes on in the holder's elector
	}
	return leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   e.cfg.LeaseDuration,
		RenewDeadline:   e.cfg.RenewDeadline,
		RetryPeriod:     retryPeriod,
		ReleaseOnCancel: holder,
		Name:            e.cfg.Namespace + "/" + e.cfg.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: started,
			OnStoppedLeading: stopped,
			OnNewLeader:      e.newLeader,
		},
	})
}

// wrote is called after a successful write of this candidate's record,
// begun at start. The term counts from the record's renew time when that is
// earlier: client-go stamps the record before its reads, and a standby that
// sees the same record (equal to the second) as before keeps counting from
// its earlier sighting, so a term counted from a late send could outlast it.
func (e *Elector) wrote(r rl.LeaderElectionRecord, start time.Time) {
	from := start
	if !r.RenewTime.IsZero() && r.RenewTime.Time.Before(from) {
		from = r.RenewTime.Time
	}
	t := Term{Lease: e.cfg.Name, FencingToken: int64(r.LeaderTransitions), Until: from.Add(TermLength(e.cfg.LeaseDuration, e.cfg.RenewDeadline))}
	e.mu.Lock()
	e.term = &t
	e.leading = true
	e.holder = e.cfg.Identity
	e.released, e.releaseErr, e.unsure = false, nil, false
	e.mu.Unlock()
	if e.cb.OnTerm != nil {
		e.cb.OnTerm(t)
	}
}

// stopped is client-go's OnStoppedLeading; it also runs for a standby whose
// Run ends without ever leading.
func (e *Elector) stopped() {
	e.mu.Lock()
	had := e.leading
	e.term, e.leading = nil, false
	e.mu.Unlock()
	if had && e.cb.OnStopped != nil {
		e.cb.OnStopped()
	}
}

func (e *Elector) newLeader(identity string) {
	e.mu.Lock()
	e.holder = identity
	e.mu.Unlock()
	if e.cb.OnNewLeader != nil {
		e.cb.OnNewLeader(identity)
	}
}

// observedLock is the LeaseLock with its successful writes observed: a
// write of this candidate's record starts or extends a term; a write of an
// empty holder is the release. It also remembers the holder it last read,
// because client-go's release checks leadership against its own older
// observation and then writes over whatever the Lease holds now.
type observedLock struct {
	rl.Interface
	e        *Elector
	lastRead string // holder identity in the last successful Get
	getErr   error  // error of the last Get, nil after a successful one
	lastErr  error  // error of the last Get, Create or Update
	releases int    // release writes attempted
	acquired func() // if set, called after a successful write of our record
	// restamp sets the record's renew time (and a new holder's acquire
	// time) to the time of the write: the standby's elector stamps it
	// before its Get, which may have waited on the watch.
	restamp bool
	// own is the Run's last write; a write of this candidate's record less
	// than skipWithin after own's, changing only the renew time, is not
	// sent (see Elector.lead). Unset for the standby's lock.
	own        *ownWrite
	skipWithin time.Duration
}

func (l *observedLock) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	r, raw, err := l.Interface.Get(ctx)
	l.getErr, l.lastErr = err, err
	if err == nil {
		l.lastRead = r.HolderIdentity
	}
	return r, raw, err
}

func (l *observedLock) Create(ctx context.Context, r rl.LeaderElectionRecord) error {
	start := l.e.cfg.Clock.Now()
	if l.restamp {
		r = stamped(r, start)
		l.e.trace(HopAcquireSent)
	}
	if err := l.Interface.Create(ctx, r); err != nil {
		l.lastErr = err
		l.unsure(err)
		return err
	}
	l.wrote(r, start)
	return nil
}

func (l *observedLock) Update(ctx context.Context, r rl.LeaderElectionRecord) error {
	if r.HolderIdentity == "" {
		return l.release(ctx, r)
	}
	if l.own != nil && r.HolderIdentity == l.e.cfg.Identity && l.own.recent(l.skipWithin, r.HolderIdentity, r.LeaderTransitions, r.LeaseDurationSeconds) {
		// Not a write, so not a renewal: the term is not moved on.
		return nil
	}
	start := l.e.cfg.Clock.Now()
	if l.restamp {
		r = stamped(r, start)
		l.e.trace(HopAcquireSent)
	}
	if err := l.Interface.Update(ctx, r); err != nil {
		l.lastErr = err
		l.unsure(err)
		return err
	}
	l.wrote(r, start)
	return nil
}

// stamped is r renewed at now, and acquired at now if it is a new holder's
// (client-go gives those equal times).
func stamped(r rl.LeaderElectionRecord, now time.Time) rl.LeaderElectionRecord {
	if r.AcquireTime.Equal(&r.RenewTime) {
		r.AcquireTime = metav1.NewTime(now)
	}
	r.RenewTime = metav1.NewTime(now)
	return r
}

// unsure records a failed write of this candidate's record that may have
// landed: any error but a conflict or an existing Lease.
func (l *observedLock) unsure(err error) {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return
	}
	l.e.mu.Lock()
	l.e.unsure = true
	l.e.mu.Unlock()
}

func (l *observedLock) wrote(r rl.LeaderElectionRecord, start time.Time) {
	if l.restamp {
		l.e.trace(HopAcquireAcked)
	}
	l.e.wrote(r, start)
	if l.acquired != nil {
		l.acquired()
	}
}

func (l *observedLock) release(ctx context.Context, r rl.LeaderElectionRecord) error {
	err := l.writeRelease(ctx, r)
	l.e.mu.Lock()
	l.e.releaseErr = err
	if err == nil {
		l.e.released = true
		l.e.holder = ""
	}
	l.e.mu.Unlock()
	return err
}

// unwritten is called when the holder's client-go elector has returned,
// led tells whether it had started leading. When it had, client-go read
// the Lease before its release write and, if the read failed or showed
// another holder, returned without a write. When it had not, it never
// renewed the Lease the standby acquired before the term ran out, and
// client-go releases only after leading. Either way the release was not
// written, and ReleaseErr says why.
func (l *observedLock) unwritten(led bool) {
	l.e.mu.Lock()
	defer l.e.mu.Unlock()
	if l.e.released || l.e.releaseErr != nil {
		return
	}
	// The term ends even without a release: client-go no longer renews.
	l.e.term = nil
	switch {
	case l.e.withhold:
		l.e.releaseErr = ErrReleaseWithheld
	case !led && l.lastErr != nil:
		l.e.releaseErr = fmt.Errorf("not released: the Lease was not renewed after its acquisition before the term ran out: %w", l.lastErr)
	case !led:
		l.e.releaseErr = fmt.Errorf("not released: the Lease was not renewed after its acquisition before the term ran out; it is held by %q", l.lastRead)
	case l.getErr != nil:
		l.e.releaseErr = fmt.Errorf("not released: reading the Lease before the release failed: %w", l.getErr)
	default:
		l.e.releaseErr = fmt.Errorf("not released: the Lease is held by %q", l.lastRead)
	}
}

func (l *observedLock) writeRelease(ctx context.Context, r rl.LeaderElectionRecord) error {
	l.e.mu.Lock()
	withhold, last := l.e.withhold, l.e.releaseErr
	// The term ends before the write: leader work must stop before the
	// Lease is free, never after.
	l.e.term = nil
	l.e.mu.Unlock()
	if withhold {
		return ErrReleaseWithheld
	}
	if l.lastRead != l.e.cfg.Identity {
		// Another candidate took the Lease while this one was cut off from
		// the API: releasing now would free the new holder's Lease.
		return fmt.Errorf("not released: the Lease is held by %q", l.lastRead)
	}
	// client-go retries on a conflict (it re-reads first, and the check
	// above sees the holder it read); a few attempts, not a tight loop for
	// the whole renew deadline.
	if l.releases++; l.releases > maxReleaseWrites {
		// %v, not %w: a wrapped conflict would make client-go retry again.
		return fmt.Errorf("not released: %d release writes met conflicts; last: %v", maxReleaseWrites, last) //nolint:errorlint // see above
	}
	l.e.trace(HopReleaseSent)
	if err := l.Interface.Update(ctx, r); err != nil {
		// Wrapped with %w: client-go retries a conflict (apierrors.IsConflict
		// looks through the wrapping).
		return fmt.Errorf("not released: the release write failed: %w", err)
	}
	l.e.trace(HopReleaseAcked)
	return nil
}
