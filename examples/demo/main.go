// Command demo runs handoff's main job on real parts and prints its
// timeline: a real kube-apiserver and etcd, a real PostgreSQL queue, and
// worker "pods" run as local processes (each a handoff sidecar and the
// pgworker example, with a real Pod object in the API). It replaces the
// Lease holder the way the kubelet would (graceful delete, preStop hook,
// SIGTERM, SIGKILL at the grace period), then does the same replacement
// without handoff's sequence, and compares the stalls. It ends by checking
// that no message was lost or applied twice, and stops all it started.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/outcome"
)

const (
	namespace  = "demo"
	leaseName  = "pgworker-leader"
	visibility = 20 * time.Second
)

type options struct {
	handoff, worker, dir string
	svg                  string
	grace                time.Duration
	rate                 int
}

func main() {
	var o options
	flag.StringVar(&o.handoff, "handoff", "bin/handoff", "path of the handoff binary")
	flag.StringVar(&o.worker, "worker", "bin/pgworker", "path of the pgworker binary")
	// Under the temporary directory: PostgreSQL runs as the postgres user,
	// which cannot enter a checkout under a private home directory.
	flag.StringVar(&o.dir, "dir", filepath.Join(os.TempDir(), "handoff-demo"), "directory for logs and PostgreSQL data")
	flag.StringVar(&o.svg, "svg", "", "where to write both timelines as an SVG picture; empty: timeline.svg in -dir")
	flag.DurationVar(&o.grace, "grace", 6*time.Second, "terminationGracePeriodSeconds of the worker pods")
	flag.IntVar(&o.rate, "rate", 5, "messages enqueued per second")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	say("starting kube-apiserver and etcd (envtest), and PostgreSQL")
	kube, stopKube, err := kubetest.StartServer()
	if err != nil {
		return err
	}
	defer stopKube()
	dbURL, stopPG, err := startPostgres(o.dir)
	if err != nil {
		return err
	}
	defer stopPG()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := queue.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}

	d := &demo{o: o, kube: kube, dbURL: dbURL, pool: pool}
	defer d.stopAll()
	go d.watchLease(ctx)
	produceCtx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	go d.produce(produceCtx)

	for _, name := range []string{"pod-a", "pod-b"} {
		if err := d.startPod(ctx, name); err != nil {
			return err
		}
	}
	holder, err := d.waitHolder(ctx, "", 30*time.Second)
	if err != nil {
		return err
	}
	say("%s holds Lease %s; both pods claim from the queue", holder, leaseName)
	time.Sleep(4 * time.Second)

	with, err := d.replace(ctx, holder, "pod-c", true)
	if err != nil {
		return err
	}
	time.Sleep(3 * time.Second)
	holder, err = d.waitHolder(ctx, "", 30*time.Second)
	if err != nil {
		return err
	}
	without, err := d.replace(ctx, holder, "pod-d", false)
	if err != nil {
		return err
	}

	stopProducing()
	say("producer stopped; waiting for the queue to empty")
	if err := d.waitEmpty(ctx, 90*time.Second); err != nil {
		return err
	}
	rep, err := queue.Check(ctx, pool)
	if err != nil {
		return err
	}
	d.summary(with, without, rep)
	svg := o.svg
	if svg == "" {
		svg = filepath.Join(o.dir, "timeline.svg")
	}
	if err := os.WriteFile(svg, timelineSVG(with, without), 0o644); err != nil {
		return err
	}
	fmt.Printf("timeline picture: %s\n", svg)
	return rep.Err()
}

// demo is the state of one run.
type demo struct {
	o     options
	kube  *kubetest.Env
	dbURL string
	pool  *pgxpool.Pool

	mu      sync.Mutex
	pods    map[string]*pod
	seq     int
	holders []holderChange
}

type holderChange struct {
	at     time.Time
	holder string // pod name, "" when released
}

// pod is one worker pod run as two local processes.
type pod struct {
	name, uid       string
	control, app    string // the sockets of the control and app APIs, as in an injected pod
	token           string // the pod's token file
	sidecar, worker *exec.Cmd
	exited          map[*exec.Cmd]chan struct{}
}

func (d *demo) startPod(ctx context.Context, name string) error {
	d.mu.Lock()
	d.seq++
	base := 17400 + 10*d.seq
	d.mu.Unlock()
	grace := int64(d.o.grace / time.Second)
	obj, err := d.kube.Client.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{NodeName: "demo-node", TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "worker", Image: "pgworker"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	// The pod's handoff-run volume: the sockets of the control and app
	// APIs, which the sidecar and the worker make.
	run := filepath.Join(d.o.dir, name+"-run")
	if err := os.MkdirAll(run, 0o700); err != nil {
		return err
	}
	p := &pod{name: name, uid: string(obj.UID), exited: map[*exec.Cmd]chan struct{}{},
		control: "unix://" + filepath.Join(run, "control.sock"), app: "unix://" + filepath.Join(run, "app.sock")}
	// The pod's token, written as the install step writes it, given to the
	// sidecar, the worker and the hook in HANDOFF_TOKEN_FILE.
	p.token = filepath.Join(d.o.dir, name+"-token")
	if out, err := exec.CommandContext(ctx, d.o.handoff, "install", "--token-file", p.token).CombinedOutput(); err != nil {
		return fmt.Errorf("write %s's token: %w\n%s", name, err, out)
	}
	p.sidecar = exec.Command(d.o.handoff, "sidecar")
	p.sidecar.Env = append(os.Environ(), "HANDOFF_TOKEN_FILE="+p.token,
		"HANDOFF_POD_NAME="+name, "HANDOFF_POD_NAMESPACE="+namespace, "HANDOFF_POD_UID="+p.uid,
		// The Lease guards the worker's leader job, a role: it is handed
		// over right after stop-claiming, not after the drain.
		"HANDOFF_LEASES="+leaseName, "HANDOFF_ROLE_LEASES="+leaseName, "HANDOFF_KUBECONFIG="+d.kube.Kubeconfig,
		"HANDOFF_CONTROL_ADDR="+p.control, fmt.Sprintf("HANDOFF_METRICS_ADDR=127.0.0.1:%d", base+1),
		"HANDOFF_APP_URL="+p.app, "HANDOFF_GRACE_PERIOD="+d.o.grace.String())
	p.worker = exec.Command(d.o.worker, "--database-url", d.dbURL, "--worker-id", name,
		"--handoff-addr", p.app, "--lease", leaseName, "--visibility-timeout", visibility.String())
	p.worker.Env = append(os.Environ(), "HANDOFF_TOKEN_FILE="+p.token, "HANDOFF_LEASE_DURATION=15s") // the sidecar's default
	for _, c := range []*exec.Cmd{p.sidecar, p.worker} {
		part := "sidecar"
		if c == p.worker {
			part = "worker"
		}
		f, err := os.Create(filepath.Join(d.o.dir, name+"-"+part+".log"))
		if err != nil {
			return err
		}
		c.Stdout, c.Stderr = f, f
		if err := c.Start(); err != nil {
			return fmt.Errorf("start %s %s: %w", name, part, err)
		}
		done := make(chan struct{})
		p.exited[c] = done
		go func() { _ = c.Wait(); _ = f.Close(); close(done) }()
	}
	d.mu.Lock()
	if d.pods == nil {
		d.pods = map[string]*pod{}
	}
	d.pods[name] = p
	d.mu.Unlock()
	return nil
}

// replacement is what one replacement of the Lease holder measured.
type replacement struct {
	handoff      bool
	old, newPod  string
	t0           time.Time // preStop called, or the kill
	steps        []string
	leaseTakenAt time.Time
	successor    string
	toldAt       time.Time     // the successor's app told it leads (its sidecar's log); zero without handoff
	stranded     int           // claims the old pod held and never finished
	firstBack    time.Duration // until the first of them was claimed again
	lastBack     time.Duration // until the last of them was
	reclaimedAll bool
	// started is when the old pod's sidecar started its sequence, and hops
	// the hops of its step 5 for the Lease (its ShutdownFinished Event's
	// summary); zero and nil without handoff.
	started time.Time
	hops    *outcome.LeaseResult
}

// replace starts newName, then terminates old: with the handoff sequence as
// the kubelet runs it, or, for the baseline, without it.
func (d *demo) replace(ctx context.Context, old, newName string, handoff bool) (*replacement, error) {
	if err := d.startPod(ctx, newName); err != nil {
		return nil, err
	}
	// A burst of slow messages, so the old pod surely holds work it cannot
	// finish within the grace period, in both runs alike.
	var burst []queue.Message
	for i := range 6 {
		burst = append(burst, queue.Message{DedupKey: fmt.Sprintf("slow-%s-%02d", old, i), Amount: 1000, WorkMillis: 15000})
	}
	if err := queue.Enqueue(ctx, d.pool, burst); err != nil {
		return nil, err
	}
	time.Sleep(2 * time.Second) // the replacement is up, and everyone claimed
	d.mu.Lock()
	p := d.pods[old]
	d.mu.Unlock()
	r := &replacement{handoff: handoff, old: old, newPod: newName}
	grace := int64(d.o.grace / time.Second)
	if handoff {
		say("replacing %s (Lease holder) with handoff: delete with grace %ds, preStop hook, SIGTERM", old, grace)
	} else {
		say("replacing %s (Lease holder) without handoff: the pod's processes just exit (no preStop, no release)", old)
	}
	r.t0 = time.Now()
	if !handoff {
		// A pod without handoff has no sidecar to see its deletion: this
		// one's is gone first, or its watch of the Pod would start the
		// sequence at the deletion and release the Lease.
		d.terminate(p, p.sidecar, r.t0, syscall.SIGKILL)
	}
	if err := d.kube.Client.CoreV1().Pods(namespace).Delete(ctx, old, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		return nil, err
	}
	killAt := r.t0.Add(d.o.grace)
	if handoff {
		hook := exec.CommandContext(ctx, d.o.handoff, "prestop", "--addr", p.control, "--timeout", d.o.grace.String(), "--token-file", p.token)
		out, err := hook.CombinedOutput()
		r.steps = append(r.steps, strings.Split(strings.TrimRight(string(out), "\n"), "\n")...)
		if err != nil {
			return nil, fmt.Errorf("preStop hook of %s: %w\n%s", old, err, out)
		}
		d.terminate(p, p.worker, killAt, syscall.SIGTERM)
		d.terminate(p, p.sidecar, killAt.Add(2*time.Second), syscall.SIGTERM)
	} else {
		d.terminate(p, p.worker, killAt, syscall.SIGTERM) // no preStop: SIGTERM at once
	}
	zero := int64(0)
	_ = d.kube.Client.CoreV1().Pods(namespace).Delete(ctx, old, metav1.DeleteOptions{GracePeriodSeconds: &zero})

	successor, err := d.waitHolder(ctx, old, 40*time.Second)
	if err != nil {
		return nil, err
	}
	r.successor = successor
	r.leaseTakenAt = d.heldSince(successor)
	if handoff {
		r.toldAt = d.appToldAt(successor, r.t0, 5*time.Second)
		r.started, r.hops = d.leaseHops(ctx, old, 5*time.Second)
	}
	// Stranded claims come back at once with handoff, or at the visibility timeout.
	waitUntil := time.Now().Add(visibility + 5*time.Second)
	for {
		if err := d.stranded(ctx, r); err != nil {
			return nil, err
		}
		if r.stranded == 0 || r.lastBack > 0 && r.reclaimedAll || time.Now().After(waitUntil) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return r, nil
}

// terminate signals one process and SIGKILLs it at killAt if still running.
func (d *demo) terminate(p *pod, c *exec.Cmd, killAt time.Time, sig syscall.Signal) {
	_ = c.Process.Signal(sig)
	select {
	case <-p.exited[c]:
	case <-time.After(time.Until(killAt)):
		_ = c.Process.Kill()
		<-p.exited[c]
	}
}

func (d *demo) stopAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.pods {
		for _, c := range []*exec.Cmd{p.worker, p.sidecar} {
			d.terminate(p, c, time.Now().Add(3*time.Second), syscall.SIGTERM)
		}
	}
}

// produce enqueues o.rate messages a second until ctx ends; one in ten
// takes 6 s of work, the rest 100–400 ms.
func (d *demo) produce(ctx context.Context) {
	tick := time.NewTicker(time.Second / time.Duration(d.o.rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		work := 100 + rand.IntN(300)
		if i%10 == 9 {
			work = 6000
		}
		msg := queue.Message{DedupKey: fmt.Sprintf("msg-%05d", i), Amount: int64(1 + rand.IntN(100)), WorkMillis: work}
		if err := queue.Enqueue(ctx, d.pool, []queue.Message{msg}); err != nil && ctx.Err() == nil {
			say("enqueue: %v", err)
		}
	}
}

// watchLease records every change of the Lease holder, polling every 20 ms.
func (d *demo) watchLease(ctx context.Context) {
	last := "?"
	for ctx.Err() == nil {
		l, err := d.kube.Client.CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
		if err == nil {
			h := ""
			if l.Spec.HolderIdentity != nil {
				h, _, _ = strings.Cut(*l.Spec.HolderIdentity, "_")
			}
			if h != last {
				d.mu.Lock()
				d.holders = append(d.holders, holderChange{at: time.Now(), holder: h})
				d.mu.Unlock()
				last = h
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitHolder waits for a holder other than not and returns it.
func (d *demo) waitHolder(ctx context.Context, not string, timeout time.Duration) (string, error) {
	end := time.Now().Add(timeout)
	for time.Now().Before(end) && ctx.Err() == nil {
		d.mu.Lock()
		var h string
		if n := len(d.holders); n > 0 {
			h = d.holders[n-1].holder
		}
		d.mu.Unlock()
		if h != "" && h != not {
			return h, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "", fmt.Errorf("no Lease holder other than %q within %s", not, timeout)
}

// appToldAt is when pod's sidecar logged that it told its app it leads,
// the first such line after t0, waiting up to timeout for it; zero if none.
func (d *demo) appToldAt(pod string, t0 time.Time, timeout time.Duration) time.Time {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		f, err := os.Open(filepath.Join(d.o.dir, pod+"-sidecar.log"))
		if err != nil {
			return time.Time{}
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			var line struct {
				Msg  string `json:"msg"`
				Told string `json:"told"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "app told it leads" {
				continue
			}
			if at, err := time.Parse(time.RFC3339Nano, line.Told); err == nil && at.After(t0) {
				_ = f.Close()
				return at
			}
		}
		_ = f.Close()
	}
	return time.Time{}
}

var summaryStarted = regexp.MustCompile(`\(trigger \S+ at (\S+)\)`)

// leaseHops reads the hops of pod's step 5 for the Lease from the summary
// of its sidecar's ShutdownFinished Event (internal/outcome), and the
// sequence's start from the Event's message, waiting up to timeout for
// the Event; zero and nil if none.
func (d *demo) leaseHops(ctx context.Context, pod string, timeout time.Duration) (time.Time, *outcome.LeaseResult) {
	for end := time.Now().Add(timeout); time.Now().Before(end) && ctx.Err() == nil; time.Sleep(50 * time.Millisecond) {
		evs, err := d.kube.Client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + pod + ",reason=" + outcome.Reason})
		if err != nil {
			continue
		}
		for _, e := range evs.Items {
			m := summaryStarted.FindStringSubmatch(e.Message)
			s, err := outcome.Decode(e.Annotations[outcome.Annotation])
			if m == nil || err != nil {
				continue
			}
			started, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				continue
			}
			for i := range s.Leases {
				if s.Leases[i].Lease == leaseName {
					return started, &s.Leases[i]
				}
			}
		}
	}
	return time.Time{}, nil
}

func (d *demo) heldSince(holder string) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := len(d.holders) - 1; i >= 0; i-- {
		if d.holders[i].holder == holder {
			return d.holders[i].at
		}
	}
	return time.Time{}
}

// stranded counts the claims the old pod held at t0 and never finished,
// and when others claimed them again.
func (d *demo) stranded(ctx context.Context, r *replacement) error {
	var first, last *time.Time
	var reclaimed int
	err := d.pool.QueryRow(ctx, `
WITH held AS (
  SELECT message_id FROM handoff_deliveries WHERE worker = $1 AND outcome = 'claimed' AND at <= $2
  EXCEPT SELECT message_id FROM handoff_deliveries WHERE worker = $1 AND outcome IN ('applied', 'duplicate')),
back AS (
  SELECT message_id, min(at) AS at FROM handoff_deliveries
  WHERE outcome = 'claimed' AND worker <> $1 AND at > $2 AND message_id IN (SELECT message_id FROM held)
  GROUP BY message_id)
SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM back), (SELECT min(at) FROM back), (SELECT max(at) FROM back)`,
		r.old, r.t0).Scan(&r.stranded, &reclaimed, &first, &last)
	if err != nil {
		return err
	}
	if first != nil {
		r.firstBack, r.lastBack = first.Sub(r.t0), last.Sub(r.t0)
	}
	r.reclaimedAll = reclaimed == r.stranded
	return nil
}

func (d *demo) waitEmpty(ctx context.Context, timeout time.Duration) error {
	end := time.Now().Add(timeout)
	for time.Now().Before(end) && ctx.Err() == nil {
		var n int
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM handoff_queue`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return errors.New("the queue did not empty in time")
}

func startPostgres(dir string) (string, func(), error) {
	data, err := filepath.Abs(filepath.Join(dir, "postgres"))
	if err != nil {
		return "", nil, err
	}
	// A fresh database each run: the checks count every message ever enqueued.
	_ = exec.Command("bash", "hack/postgres.sh", "stop", data).Run()
	if err := os.RemoveAll(data); err != nil {
		return "", nil, err
	}
	cmd := exec.Command("bash", "hack/postgres.sh", "start", data, "55433")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", nil, fmt.Errorf("hack/postgres.sh start: %w", err)
	}
	stop := func() { _ = exec.Command("bash", "hack/postgres.sh", "stop", data).Run() }
	return strings.TrimSpace(string(out)), stop, nil
}

func say(format string, args ...any) {
	fmt.Printf("%s  "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}
