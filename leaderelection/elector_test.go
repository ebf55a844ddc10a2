package leaderelection_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/leaderelection"
)

// Short timings keep the tests quick; the relations are client-go's.
const (
	leaseDuration = 3 * time.Second
	renewDeadline = 2 * time.Second
	retryPeriod   = 250 * time.Millisecond
	leaseName     = "work"
)

func TestMain(m *testing.M) {
	if os.Getenv("ELECTOR_CHILD") != "" {
		runChild()
		return
	}
	kubetest.Run(m)
}

// runChild competes for the Lease in a separate process until it is killed,
// so a test can crash a holder for real.
func runChild() {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		panic(err)
	}
	kube := kubernetes.NewForConfigOrDie(cfg)
	e, err := leaderelection.New(config(kube, os.Getenv("ELECTOR_NAMESPACE"), os.Getenv("ELECTOR_CHILD")), leaderelection.Callbacks{
		OnTerm: func(t leaderelection.Term) { fmt.Printf("term %d\n", t.FencingToken) },
	})
	if err != nil {
		panic(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	e.Run(ctx)
}

func config(kube kubernetes.Interface, ns, identity string) leaderelection.Config {
	return leaderelection.Config{
		Leases: kube.CoordinationV1(), Namespace: ns, Name: leaseName, Identity: identity,
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
	}
}

// candidate runs one Elector in the test process.
type candidate struct {
	e      *leaderelection.Elector
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	terms  []leaderelection.Term
	// termAt is when each OnTerm call came, on the local clock; stopAt
	// when stop was called.
	termAt []time.Time
	stopAt time.Time
	// endAt is when Run returned after stop: after its release, if written.
	endAt time.Time
}

func start(t *testing.T, ns, identity string) *candidate {
	t.Helper()
	return startWith(t, ns, identity, kubetest.Get(t).Client.CoordinationV1())
}

// startWith runs a candidate whose Lease traffic goes through leases.
func startWith(t *testing.T, ns, identity string, leases coordinationv1client.LeasesGetter) *candidate {
	t.Helper()
	cfg := config(kubetest.Get(t).Client, ns, identity)
	cfg.Leases = leases
	return startConfig(t, cfg)
}

// startConfig runs a candidate with cfg (its Logger set to the test's).
func startConfig(t *testing.T, cfg leaderelection.Config) *candidate {
	t.Helper()
	c := &candidate{done: make(chan struct{})}
	cfg.Logger = testr.New(t)
	e, err := leaderelection.New(cfg, leaderelection.Callbacks{OnTerm: func(tm leaderelection.Term) {
		c.mu.Lock()
		c.terms = append(c.terms, tm)
		c.termAt = append(c.termAt, time.Now())
		c.mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.e, c.cancel = e, cancel
	go func() { defer close(c.done); e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

func (c *candidate) stop() {
	c.mu.Lock()
	c.stopAt = time.Now()
	c.mu.Unlock()
	c.cancel()
	<-c.done
	c.mu.Lock()
	c.endAt = time.Now()
	c.mu.Unlock()
}

// termsCopy is the terms so far, in order.
func (c *candidate) termsCopy() []leaderelection.Term {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]leaderelection.Term(nil), c.terms...)
}

func getLease(t *testing.T, ns string) *coordinationv1.Lease {
	t.Helper()
	l, err := kubetest.Get(t).Client.CoordinationV1().Leases(ns).Get(context.Background(), leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease: %v", err)
	}
	return l
}

func leading(c *candidate) bool { _, ok := c.e.Term(); return ok }

// holding is leading with the holder's client-go elector renewing: the
// first term comes from the standby's acquisition, the next from the
// holder's first renewal, after which a cancel releases the Lease.
func holding(c *candidate) bool {
	c.mu.Lock()
	renewed := len(c.terms) >= 2
	c.mu.Unlock()
	return renewed && leading(c)
}

func TestTwoCandidatesOneLeads(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	a, b := start(t, ns, "pod-a_uid-a"), start(t, ns, "pod-b_uid-b")
	kubetest.WaitFor(t, 10*time.Second, "a leader", func() bool { return leading(a) || leading(b) })

	// Over several renewals exactly one leads, and the Lease names it.
	for end := time.Now().Add(4 * leaseDuration / 3); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if leading(a) == leading(b) {
			t.Fatalf("a leading=%t, b leading=%t: want exactly one", leading(a), leading(b))
		}
	}
	leader, want := a, "pod-a_uid-a"
	if leading(b) {
		leader, want = b, "pod-b_uid-b"
	}
	l := getLease(t, ns)
	if got := *l.Spec.HolderIdentity; got != want {
		t.Errorf("Lease holder = %q, want %q", got, want)
	}
	term, _ := leader.e.Term()
	if got := int64(*l.Spec.LeaseTransitions); term.FencingToken != got {
		t.Errorf("fencing token = %d, want the Lease's leaseTransitions %d", term.FencingToken, got)
	}
	// The term ends before anyone else could take the Lease: within the renew
	// deadline of the Lease's last renewal, well inside its lease duration.
	if limit := l.Spec.RenewTime.Add(leaseDuration); !term.Until.Before(limit) {
		t.Errorf("term until %s is not before renewTime+leaseDuration %s", term.Until, limit)
	}
}

func TestReleaseOnCancelHandsOverToStandby(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	a := start(t, ns, "pod-a_uid-a")
	kubetest.WaitFor(t, 10*time.Second, "a to lead", func() bool { return leading(a) })
	before, _ := a.e.Term()
	b := start(t, ns, "pod-b_uid-b")

	released := time.Now()
	a.stop()
	if !a.e.Released() {
		t.Fatal("a did not release the Lease on cancel")
	}
	if leading(a) {
		t.Fatal("a still has a term after release")
	}
	// The standby takes it at its next retry, long before the lease duration.
	took := kubetest.WaitFor(t, leaseDuration, "b to lead after release", func() bool { return leading(b) })
	t.Logf("handover after release: %s", took.Sub(released))
	after, _ := b.e.Term()
	if after.FencingToken <= before.FencingToken {
		t.Errorf("fencing token after handover = %d, want more than %d", after.FencingToken, before.FencingToken)
	}
	if got := *getLease(t, ns).Spec.HolderIdentity; got != "pod-b_uid-b" {
		t.Errorf("Lease holder = %q, want pod-b_uid-b", got)
	}
}

func TestCrashedHolderIsTakenOverOnlyAfterLeaseDuration(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "ELECTOR_CHILD=pod-a_uid-a", "ELECTOR_NAMESPACE="+ns, "KUBECONFIG="+env.Kubeconfig)
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	kubetest.WaitFor(t, 20*time.Second, "the child to hold the Lease", func() bool {
		l, err := env.Client.CoordinationV1().Leases(ns).Get(context.Background(), leaseName, metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "pod-a_uid-a"
	})
	b := start(t, ns, "pod-b_uid-b")
	time.Sleep(2 * retryPeriod) // b observes a live holder

	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	// A renewal sent just before the kill may still land: read the Lease
	// once in-flight requests are done, still well inside the lease duration.
	time.Sleep(leaseDuration / 3)
	l := getLease(t, ns)
	if got := *l.Spec.HolderIdentity; got != "pod-a_uid-a" || leading(b) {
		t.Fatalf("Lease holder %s after the crash, b leading %t: want the crashed holder until its lease duration ends", got, leading(b))
	}
	lastRenew := l.Spec.RenewTime.Time

	took := kubetest.WaitFor(t, leaseDuration+renewDeadline+2*time.Second, "b to take over the crashed holder's Lease", func() bool { return leading(b) })
	// client-go compares records at one-second resolution (see TermLength),
	// so expiry counts from the second of the last renewal.
	if earliest := lastRenew.Truncate(time.Second).Add(leaseDuration); took.Before(earliest) {
		t.Errorf("b took the Lease %s after the last renewal, before the lease duration %s ran out", took.Sub(lastRenew), leaseDuration)
	}
	// The crashed holder's last term ended before b could act.
	if until := lastRenew.Add(leaderelection.TermLength(leaseDuration, renewDeadline)); !until.Before(took) {
		t.Errorf("the crashed holder's term ran until %s, after b took the Lease at %s", until, took)
	}
	t.Logf("takeover after crash: %s after the last renewal", took.Sub(lastRenew))
}

func TestWithholdReleaseLeavesLeaseToExpire(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	a := start(t, ns, "pod-a_uid-a")
	kubetest.WaitFor(t, 10*time.Second, "a to lead", func() bool { return leading(a) })
	a.e.WithholdRelease()
	a.stop()
	if a.e.Released() {
		t.Fatal("released although withheld")
	}
	if got := *getLease(t, ns).Spec.HolderIdentity; got != "pod-a_uid-a" {
		t.Errorf("Lease holder after withheld release = %q, want pod-a_uid-a", got)
	}
}

func TestNewRejectsInconsistentTimings(t *testing.T) {
	cfg := leaderelection.Config{Namespace: "ns", Name: "l", Identity: "i",
		LeaseDuration: time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: time.Second}
	if _, err := leaderelection.New(cfg, leaderelection.Callbacks{}); err == nil {
		t.Fatal("New accepted renew deadline longer than the lease duration")
	}
	// client-go accepts these, but they leave no term (TermLength 0).
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 1500*time.Millisecond, time.Second, 200*time.Millisecond
	if _, err := leaderelection.New(cfg, leaderelection.Callbacks{}); err == nil || !strings.Contains(err.Error(), "leaves no term") {
		t.Fatalf("New with lease duration 1.5s: %v, want an error saying it leaves no term", err)
	}
}
