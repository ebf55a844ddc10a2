// Command scale measures many Leases over many sidecars on one real
// kube-apiserver and etcd (envtest), for handoff and for plain client-go
// electors with the same Leases, layout and timings, one after the other in
// one run:
//
//   - API requests per second on Leases, in total and per Lease, by verb,
//     from the apiserver's own apiserver_request_total;
//   - the CPU of the apiserver and of etcd (/proc/<pid>/stat), and of the
//     candidates;
//   - app-visible lapses of leadership and the longest gap between two
//     renewals of a Lease;
//   - standby reads of the API per Lease;
//   - handover latency under that load, for every Lease of a few leader
//     sidecars released at once.
//
// Layout: -pairs pairs of sidecars sharing -per Leases each (one leads them
// all, the other stands by for them all), and one more pair sharing -big
// Leases. handoff runs each sidecar as the real `handoff sidecar` process
// with its app (the worker library) served in this command; client-go runs
// each "sidecar" in this process as one client of its own (its own
// connection, the same rate budget as handoff's for that many Leases)
// with one LeaderElector per Lease on a LeaseLock.
//
// Usage: go run ./bench/scale --handoff bin/handoff [-pairs 25 -per 20 -big 100 -window 60s]
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientgole "k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/handoff-dev/handoff/bench/internal/benchenv"
	"github.com/handoff-dev/handoff/bench/internal/stats"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/leadtrace"
	"github.com/handoff-dev/handoff/leaderelection"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// flags are the command's own: imported libraries register theirs on
// flag.CommandLine (controller-runtime's -kubeconfig), which this command does not read.
var flags = flag.NewFlagSet(os.Args[0], flag.ExitOnError)

var (
	handoff       = flags.String("handoff", "bin/handoff", "the handoff binary (make build)")
	pairs         = flags.Int("pairs", 25, "pairs of sidecars sharing -per Leases")
	per           = flags.Int("per", 20, "Leases per pair")
	big           = flags.Int("big", 100, "Leases of the one big pair")
	window        = flags.Duration("window", time.Minute, "how long requests, CPU and lapses are counted")
	settle        = flags.Duration("settle", 15*time.Second, "time after every standby is up before counting")
	handovers     = flags.Int("handover-sidecars", 2, "leader sidecars of -per Leases handed over (then the big one)")
	leaseDuration = flags.Duration("lease-duration", 15*time.Second, "lease duration, both implementations")
	renewDeadline = flags.Duration("renew-deadline", 10*time.Second, "renew deadline, both implementations")
	retryPeriod   = flags.Duration("retry-period", 2*time.Second, "retry period, both implementations")
	logs          = flags.String("logs", "", "a directory to keep the handoff sidecars' logs in (default: none kept)")
)

func main() {
	flags.Usage = func() {
		fmt.Fprintf(flags.Output(), "Usage: %s [flags]\n\nStarts its own kube-apiserver and etcd (binaries from KUBEBUILDER_ASSETS, or\nbuilt by hack/kube-assets.sh), runs many Leases over many sidecars for handoff\nand for plain client-go, and prints the API load, the apiserver's CPU, lapses\nand handover latency of each.\n\n", os.Args[0])
		flags.PrintDefaults()
	}
	_ = flags.Parse(os.Args[1:])   // ExitOnError
	klog.SetLogger(logr.Discard()) // client-go's own election logs
	if child := os.Getenv(childEnv); child != "" {
		if err := runChild(child); err != nil {
			fmt.Fprintln(os.Stderr, "scale: client-go sidecar:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// spec is one sidecar: the Leases it competes for, and whether it is
// started first, to lead them.
type spec struct {
	name   string
	leases []string
	leader bool
}

func layout() []spec {
	var out []spec
	add := func(group string, n int) {
		leases := make([]string, n)
		for i := range leases {
			leases[i] = fmt.Sprintf("%s-%03d", group, i)
		}
		out = append(out, spec{group + "-a", leases, true}, spec{group + "-b", leases, false})
	}
	for p := range *pairs {
		add(fmt.Sprintf("p%02d", p), *per)
	}
	add("big", *big)
	return out
}

// handedOver are the leader sidecars whose Leases are handed over.
func handedOver(specs []spec) []spec {
	var out []spec
	for _, s := range specs {
		if s.leader && (len(out) < *handovers || s.name == "big-a") {
			out = append(out, s)
		}
	}
	return out
}

type result struct {
	name       string
	requests   map[string]float64 // Lease requests by verb over the window
	apiserver  float64            // millicores
	etcd       float64
	cands      float64 // the candidates' CPU, millicores
	lapses     int
	lapsed     time.Duration
	lost       int // leadership lost in the window (client-go's OnStoppedLeading, handoff's LeaseLost Events)
	lostBefore int // and before it, while the sidecars started
	maxGap     time.Duration
	leading    int
	handover   []time.Duration // release record stamped -> standby's app (or callback) told
	acquire    []time.Duration // release record stamped -> standby's acquiring record stamped
	missing    int             // handed-over Leases the standby did not take
	// bySize is handover by the number of Leases of the sidecar released.
	bySize map[int][]time.Duration
	// load is the load average over one minute (/proc/loadavg) as the
	// implementation's sidecars were started and once its handovers were done.
	load [2]string
}

// loadAverage is the first field of /proc/loadavg: the load average over
// the last minute, on this machine's 2 shared cores.
func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func (r *result) addBySize(n int, d time.Duration) {
	if r.bySize == nil {
		r.bySize = map[int][]time.Duration{}
	}
	r.bySize[n] = append(r.bySize[n], d)
}

func run() error {
	if _, err := os.Stat(*handoff); err != nil {
		return fmt.Errorf("%w (build it with make build)", err)
	}
	env, stop, err := benchenv.Start()
	if err != nil {
		return err
	}
	defer stop()
	specs := layout()
	leases := 0
	for _, s := range specs {
		if s.leader {
			leases += len(s.leases)
		}
	}
	fmt.Printf("Scale: %d Leases over %d sidecars (%d pairs sharing %d Leases, one pair sharing %d), each Lease with one leader and one standby, on one apiserver\n",
		leases, len(specs), *pairs, *per, *big)
	fmt.Printf("Lease timings for both: lease duration %s, renew deadline %s, retry period %s; counted over %s after %s settling\n\n",
		*leaseDuration, *renewDeadline, *retryPeriod, *window, *settle)

	var results []result
	for _, im := range []struct {
		name string
		run  func(*kubetest.Env, string, []spec) (result, error)
	}{{"handoff", runHandoff}, {"client-go", runClientGo}} {
		ns := "scale-" + im.name
		load0 := loadAverage()
		if _, err := env.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		r, err := im.run(env, ns, specs)
		if err != nil {
			return fmt.Errorf("%s: %w", im.name, err)
		}
		r.name = im.name
		r.load = [2]string{load0, loadAverage()}
		results = append(results, r)
	}
	report(results, leases)
	return nil
}

func report(results []result, leases int) {
	secs := window.Seconds()
	fmt.Printf("%-10s %8s %13s %12s %8s %9s %7s %5s %9s %14s %8s\n", "", "req/s", "req/Lease/min", "apiserver mc", "etcd mc", "cand. mc", "lapses", "lost", "max gap", "reads/Lease/min", "leading")
	for _, r := range results {
		total := 0.0
		for _, n := range r.requests {
			total += n
		}
		reads := (r.requests["GET"] + r.requests["LIST"]) / float64(leases) / window.Minutes()
		fmt.Printf("%-10s %8.1f %13.1f %12.0f %8.0f %9.0f %7d %5d %9s %14.1f %4d/%d\n", r.name, total/secs, total/float64(leases)/window.Minutes(),
			r.apiserver, r.etcd, r.cands, r.lapses, r.lost, stats.Round(r.maxGap), reads, r.leading, leases)
	}
	fmt.Println()
	for _, r := range results {
		fmt.Printf("  %-10s Lease requests by verb over %s: %s; leaderships lost before counting (start-up): %d\n", r.name, *window, verbs(r.requests), r.lostBefore)
	}
	for _, r := range results {
		fmt.Printf("  %-10s load average (1 min, 2 cores) at its start %s, after its handovers %s\n", r.name, r.load[0], r.load[1])
	}
	fmt.Println()
	fmt.Printf("Handover under that load: every Lease of %d leader sidecars of %d Leases and of the one of %d, each sidecar's released at once (target: handoff p99 <= 50ms)\n", *handovers, *per, *big)
	fmt.Println("  release written -> standby's acquiring write (the records' own stamps):")
	for _, r := range results {
		fmt.Printf("    %-10s %s\n", r.name, stats.Summary(r.acquire))
	}
	fmt.Println("  release written -> the standby's app told (handoff) / its OnStartedLeading (client-go):")
	for _, r := range results {
		miss := ""
		if r.missing > 0 {
			miss = fmt.Sprintf("; %d not taken by the standby", r.missing)
		}
		fmt.Printf("    %-10s %s%s\n", r.name, stats.Summary(r.handover), miss)
	}
	fmt.Println("  the same, by the number of Leases of the sidecar released:")
	for _, r := range results {
		sizes := make([]int, 0, len(r.bySize))
		for n := range r.bySize {
			sizes = append(sizes, n)
		}
		sort.Ints(sizes)
		for _, n := range sizes {
			fmt.Printf("    %-10s %3d at once: %s\n", r.name, n, stats.Summary(r.bySize[n]))
		}
	}
	if len(results) == 2 && len(results[0].handover) > 0 {
		p99 := float64(stats.Percentile(results[1].handover, 99)) / float64(max(1, stats.Percentile(results[0].handover, 99)))
		fmt.Printf("  handoff is %.0fx faster at p99\n", p99)
	}
	fmt.Println()
	fmt.Println("Targets at scale: 0 app-visible lapses, standby reads 0 per Lease, handover p99 <= 50ms.")
	fmt.Println("(from the apiserver's apiserver_request_total for Leases; mc: millicores over the window, apiserver and etcd from /proc/<pid>/stat;")
	fmt.Println(" cand.: the sidecar processes' own CPU; lapses: stretches in which an app once granted a Lease did not lead it (client-go: leadership lost);")
	fmt.Println(" max gap: the longest time between two renewals of a Lease; reads: GET and LIST of Leases by every client, the standbys' at most)")
}

func verbs(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// meter reads the apiserver's request counts and the CPU of the control
// plane's processes at the start and end of the window.
type meter struct {
	env        *kubetest.Env
	t0         time.Time
	req0       map[string]float64
	api0, etc0 time.Duration
	cands      func() time.Duration
	cand0      time.Duration
}

func startMeter(env *kubetest.Env, cands func() time.Duration) (*meter, error) {
	m := &meter{env: env, cands: cands}
	var err error
	if m.req0, err = leaseRequests(env); err != nil {
		return nil, err
	}
	m.api0, m.etc0 = cpuOf("kube-apiserver"), cpuOf("etcd")
	m.cand0 = cands()
	m.t0 = time.Now()
	return m, nil
}

func (m *meter) stop(r *result) error {
	req, err := leaseRequests(m.env)
	if err != nil {
		return err
	}
	elapsed := time.Since(m.t0)
	mc := func(d time.Duration) float64 { return float64(d) / float64(elapsed) * 1000 }
	r.apiserver, r.etcd, r.cands = mc(cpuOf("kube-apiserver")-m.api0), mc(cpuOf("etcd")-m.etc0), mc(m.cands()-m.cand0)
	r.requests = map[string]float64{}
	for k, v := range req {
		if d := v - m.req0[k]; d > 0 {
			r.requests[k] = d
		}
	}
	return nil
}

var requestTotal = regexp.MustCompile(`^apiserver_request_total\{(.*)\} ([0-9.e+]+)$`)

// leaseRequests is the apiserver's apiserver_request_total for Leases, by
// verb, summed over its other labels (code, scope, ...).
func leaseRequests(env *kubetest.Env) (map[string]float64, error) {
	raw, err := env.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		return nil, fmt.Errorf("apiserver /metrics: %w", err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := requestTotal.FindStringSubmatch(sc.Text())
		if m == nil || !strings.Contains(m[1], `resource="leases"`) {
			continue
		}
		verb := regexp.MustCompile(`verb="([A-Z]+)"`).FindStringSubmatch(m[1])
		v, err := strconv.ParseFloat(m[2], 64)
		if verb == nil || err != nil {
			continue
		}
		out[verb[1]] += v
	}
	return out, sc.Err()
}

// cpuOf is the CPU time of this command's child process named comm (the
// control plane envtest started), 0 if none.
func cpuOf(comm string) time.Duration {
	entries, _ := os.ReadDir("/proc")
	me := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(raw)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < 0 || s[open+1:end] != comm {
			continue
		}
		f := strings.Fields(s[end+2:])
		if f[1] != me {
			continue
		}
		if d, err := cpuTime(pid); err == nil {
			return d
		}
	}
	return 0
}

// cpuTime is the user plus system CPU time of pid and its threads, from
// /proc/<pid>/stat (clock ticks of 10 ms).
func cpuTime(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// ---- handoff: the real sidecar processes ----

type process struct {
	spec    spec
	cmd     *exec.Cmd
	control string
	trace   *leadtrace.Trace
	pod     string
	exited  chan struct{}
	err     error
}

func runHandoff(env *kubetest.Env, ns string, specs []spec) (result, error) {
	var r result
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	renewals := leadtrace.WatchRenewals(ctx, env.Client, ns)
	procs := make([]*process, len(specs))
	defer func() {
		var wg sync.WaitGroup
		for _, p := range procs {
			if p != nil {
				wg.Go(p.stop)
			}
		}
		wg.Wait()
	}()
	for _, leader := range []bool{true, false} {
		errs := make([]error, len(specs))
		var wg sync.WaitGroup
		for i, s := range specs {
			if s.leader != leader {
				continue
			}
			wg.Go(func() { procs[i], errs[i] = startSidecar(env, ns, s) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return r, err
		}
		for i, s := range specs {
			if s.leader != leader {
				continue
			}
			if err := procs[i].waitUp(leader); err != nil {
				return r, err
			}
		}
	}
	time.Sleep(*settle)

	traces := func() (s leadtrace.Summary) {
		for _, p := range procs {
			x := p.trace.Summary()
			s.Lapses += x.Lapses
			s.Lapsed += x.Lapsed
			s.Leading += x.Leading
		}
		return s
	}
	lostEvents := func() (int, error) {
		list, err := env.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=LeaseLost"})
		if err != nil {
			return 0, err
		}
		n := 0
		for _, e := range list.Items {
			n += int(e.Count)
		}
		return n, nil
	}
	lost0, err := lostEvents()
	if err != nil {
		return r, err
	}
	before := traces()
	renewals.Reset()
	m, err := startMeter(env, func() time.Duration {
		var t time.Duration
		for _, p := range procs {
			d, _ := cpuTime(p.cmd.Process.Pid)
			t += d
		}
		return t
	})
	if err != nil {
		return r, err
	}
	time.Sleep(*window)
	if err := m.stop(&r); err != nil {
		return r, err
	}
	after := traces()
	r.lapses, r.lapsed, r.leading = after.Lapses-before.Lapses, after.Lapsed-before.Lapsed, after.Leading
	gaps, _ := renewals.Gaps(time.Now())
	for _, g := range gaps {
		r.maxGap = max(r.maxGap, g)
	}
	// The Events of the window: their writes lag by a little.
	time.Sleep(time.Second)
	lost1, err := lostEvents()
	if err != nil {
		return r, err
	}
	r.lost, r.lostBefore = lost1-lost0, lost0

	// Handovers: the leader's pod deleted and its preStop called, as the
	// kubelet would; its sequence releases every Lease at once.
	standbyOf := map[string]*process{}
	for _, p := range procs {
		if !p.spec.leader {
			for _, l := range p.spec.leases {
				standbyOf[l] = p
			}
		}
	}
	for _, s := range handedOver(specs) {
		var p *process
		for _, x := range procs {
			if x.spec.name == s.name {
				p = x
			}
		}
		if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), p.pod, metav1.DeleteOptions{}); err != nil {
			return r, err
		}
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		tok, _, err := benchenv.PodToken()
		if err == nil {
			_, err = prestop.Call(cctx, tcp(p.control), tok, 5*time.Second)
		}
		ccancel()
		if err != nil {
			return r, fmt.Errorf("preStop of %s: %w", s.name, err)
		}
		deadline := time.Now().Add(*leaseDuration)
		for _, l := range s.leases {
			for {
				released := renewals.Released(l)
				took, _ := standbyOf[l].trace.TermStart(l)
				acquired, _ := renewals.Acquired(l)
				if !released.IsZero() && took.After(released) && acquired.After(released) {
					r.handover = append(r.handover, took.Sub(released))
					r.acquire = append(r.acquire, acquired.Sub(released))
					r.addBySize(len(s.leases), took.Sub(released))
					break
				}
				if time.Now().After(deadline) {
					r.missing++
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	return r, nil
}

func startSidecar(env *kubetest.Env, ns string, s spec) (*process, error) {
	podToken, tokenFile, err := benchenv.PodToken()
	if err != nil {
		return nil, err
	}
	grace := int64(30)
	pod, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: "bench-node", TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "worker", Image: "worker"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	p := &process{spec: s, trace: leadtrace.New(), pod: s.name, exited: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	agent, err := worker.New(worker.Options{Token: podToken})
	if err != nil {
		return nil, err
	}
	app := &http.Server{Handler: p.trace.Wrap(agent.Handler()), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = app.Serve(ln) }()
	benchenv.AtExit(func() { _ = app.Close() })
	if p.control, err = freeAddr(); err != nil {
		return nil, err
	}
	p.cmd = exec.Command(*handoff, "sidecar")
	p.cmd.Env = append(os.Environ(),
		"HANDOFF_POD_NAME="+s.name, "HANDOFF_POD_NAMESPACE="+ns, "HANDOFF_POD_UID="+string(pod.UID),
		"HANDOFF_LEASES="+strings.Join(s.leases, ","), "HANDOFF_KUBECONFIG="+env.Kubeconfig,
		"HANDOFF_TOKEN_FILE="+tokenFile, "HANDOFF_CONTROL_ADDR="+p.control, "HANDOFF_METRICS_ADDR=127.0.0.1:0", "HANDOFF_APP_URL=http://"+ln.Addr().String(),
		"HANDOFF_LEASE_DURATION="+leaseDuration.String(), "HANDOFF_RENEW_DEADLINE="+renewDeadline.String(),
		"HANDOFF_RETRY_PERIOD="+retryPeriod.String())
	dir := *logs
	if dir == "" {
		dir = os.TempDir()
	}
	log, err := os.Create(filepath.Join(dir, "handoff-scale-"+ns+"-"+s.name+".log"))
	if err != nil {
		return nil, err
	}
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	benchenv.AtExit(func() { _ = p.cmd.Process.Kill() })
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
		_ = log.Close()
		if *logs == "" {
			_ = os.Remove(log.Name())
		}
	}()
	return p, nil
}

// waitUp waits until a leader's app leads all its Leases, or a standby's
// elections all see the leader holding them.
func (p *process) waitUp(leader bool) error {
	// Generous: on a loaded machine 52 sidecars starting at once can take a
	// while.
	timeout := 4 * *leaseDuration
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if st, err := status(p.control); err == nil && len(st.Leases) == len(p.spec.leases) {
			ok := 0
			for _, l := range st.Leases {
				if leader && l.Leader && p.trace.Leading(l.Lease) || !leader && !l.Leader && l.HolderIdentity != "" {
					ok++
				}
			}
			if ok == len(p.spec.leases) {
				return nil
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("sidecar %s exited: %w", p.spec.name, p.err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("sidecar %s (%d Leases, leader %v) not up within %s", p.spec.name, len(p.spec.leases), leader, timeout)
}

// stop sends SIGTERM and waits for the exit.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// nextPort is where freeAddr looks next: below the kernel's ephemeral range
// (32768 and up by default), so the port cannot be taken, between this
// check and the sidecar's bind, as the local port of one of the many
// outgoing connections the sidecars open to the apiserver.
var (
	portMu   sync.Mutex
	nextPort = 21000
)

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr() (string, error) {
	portMu.Lock()
	defer portMu.Unlock()
	for ; nextPort < 32768; nextPort++ {
		addr := fmt.Sprintf("127.0.0.1:%d", nextPort)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		nextPort++
		return addr, l.Close()
	}
	return "", errors.New("no free port below 32768")
}

// tcp is the sidecar's control address, on loopback TCP (the opt-in
// transport: the bench's processes share one network namespace).
func tcp(addr string) protocol.Endpoint { return protocol.Endpoint{Network: "tcp", Address: addr} }

// status asks the sidecar at the control address addr for its status, a
// call signed with the pod's token, bounded by a second.
func status(addr string) (*protocol.Status, error) {
	tok, _, err := benchenv.PodToken()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return prestop.GetStatus(ctx, tcp(addr), tok)
}

// ---- client-go: plain LeaderElectors, one process per sidecar ----

// childEnv names the variable that makes this command a client-go
// "sidecar": the JSON of its spec, with the namespace and kubeconfig.
const childEnv = "HANDOFF_SCALE_CLIENTGO"

type childSpec struct {
	Namespace, Kubeconfig, Identity string
	Leases                          []string
}

// cgSidecar is one client-go sidecar process, as its parent sees it.
type cgSidecar struct {
	spec   spec
	cmd    *exec.Cmd
	exited chan struct{}

	mu      sync.Mutex
	led     map[string]time.Time // when each Lease was last led
	leading map[string]bool
	lost    int // leadership ended without a cancel
}

func runClientGo(env *kubetest.Env, ns string, specs []spec) (result, error) {
	var r result
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	renewals := leadtrace.WatchRenewals(ctx, env.Client, ns)
	sidecars := make([]*cgSidecar, len(specs))
	defer func() {
		var wg sync.WaitGroup
		for _, s := range sidecars {
			if s != nil {
				wg.Go(s.stop)
			}
		}
		wg.Wait()
	}()
	for _, leader := range []bool{true, false} {
		for i, s := range specs {
			if s.leader == leader {
				c, err := startChild(env, ns, s)
				if err != nil {
					return r, err
				}
				sidecars[i] = c
			}
		}
		if !leader {
			break
		}
		timeout := 2 * *leaseDuration
		deadline := time.Now().Add(timeout)
		for i, s := range specs {
			for s.leader && sidecars[i].leadingCount() < len(s.leases) {
				if time.Now().After(deadline) {
					return r, fmt.Errorf("%s led %d of its %d Leases within %s", s.name, sidecars[i].leadingCount(), len(s.leases), timeout)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	// A standby has read its Lease by its first retry periods.
	time.Sleep(*settle)

	lost := func() (n, leading int) {
		for _, s := range sidecars {
			s.mu.Lock()
			n += s.lost
			s.mu.Unlock()
			leading += s.leadingCount()
		}
		return n, leading
	}
	lost0, _ := lost()
	r.lostBefore = lost0
	renewals.Reset()
	m, err := startMeter(env, func() time.Duration {
		var t time.Duration
		for _, s := range sidecars {
			d, _ := cpuTime(s.cmd.Process.Pid)
			t += d
		}
		return t
	})
	if err != nil {
		return r, err
	}
	time.Sleep(*window)
	if err := m.stop(&r); err != nil {
		return r, err
	}
	lost1, leading := lost()
	r.lost, r.leading = lost1-lost0, leading
	// With no term of its own, a client-go app's leadership lapses when it
	// is lost.
	r.lapses = r.lost
	gaps, _ := renewals.Gaps(time.Now())
	for _, g := range gaps {
		r.maxGap = max(r.maxGap, g)
	}

	standbyOf := map[string]*cgSidecar{}
	for _, s := range sidecars {
		if !s.spec.leader {
			for _, l := range s.spec.leases {
				standbyOf[l] = s
			}
		}
	}
	for _, hs := range handedOver(specs) {
		var s *cgSidecar
		for _, x := range sidecars {
			if x.spec.name == hs.name {
				s = x
			}
		}
		// SIGTERM: the sidecar's electors all end at once; each releases
		// its Lease.
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		deadline := time.Now().Add(*leaseDuration + 3**retryPeriod)
		for _, l := range hs.leases {
			for {
				released := renewals.Released(l)
				st := standbyOf[l]
				st.mu.Lock()
				took := st.led[l]
				st.mu.Unlock()
				acquired, _ := renewals.Acquired(l)
				if !released.IsZero() && took.After(released) && acquired.After(released) {
					r.handover = append(r.handover, took.Sub(released))
					r.acquire = append(r.acquire, acquired.Sub(released))
					r.addBySize(len(hs.leases), took.Sub(released))
					break
				}
				if time.Now().After(deadline) {
					r.missing++
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	return r, nil
}

func (s *cgSidecar) leadingCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ok := range s.leading {
		if ok {
			n++
		}
	}
	return n
}

// startChild runs this command as a client-go sidecar for s, reading what
// its electors report.
func startChild(env *kubetest.Env, ns string, s spec) (*cgSidecar, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(childSpec{Namespace: ns, Kubeconfig: env.Kubeconfig, Identity: s.name, Leases: s.leases})
	if err != nil {
		return nil, err
	}
	c := &cgSidecar{spec: s, exited: make(chan struct{}), led: map[string]time.Time{}, leading: map[string]bool{}}
	c.cmd = exec.Command(self, os.Args[1:]...)
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(js))
	c.cmd.Stderr = os.Stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	benchenv.AtExit(func() { _ = c.cmd.Process.Kill() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 {
				continue
			}
			c.mu.Lock()
			switch f[0] {
			case "led":
				if len(f) == 3 {
					ns, _ := strconv.ParseInt(f[2], 10, 64)
					c.led[f[1]], c.leading[f[1]] = time.Unix(0, ns), true
				}
			case "stopped":
				c.leading[f[1]] = false
			case "lost":
				c.leading[f[1]] = false
				c.lost++
			}
			c.mu.Unlock()
		}
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

func (s *cgSidecar) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// runChild is a client-go sidecar: one client of its own, with the rate
// budget a handoff sidecar with as many Leases has (client-go's default of
// 5/s could not renew them), and one LeaderElector per Lease on a
// LeaseLock with ReleaseOnCancel. It prints "led <lease> <unix ns>",
// "stopped <lease>" and "lost <lease>" lines, and releases every Lease on
// SIGTERM.
func runChild(raw string) error {
	var cs childSpec
	if err := json.Unmarshal([]byte(raw), &cs); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", cs.Kubeconfig)
	if err != nil {
		return err
	}
	b := leaderelection.ClientBudget(len(cs.Leases), *retryPeriod)
	cfg.QPS, cfg.Burst = b.QPS, b.Burst
	leases := kubernetes.NewForConfigOrDie(cfg).CoordinationV1()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	var (
		out sync.Mutex
		wg  sync.WaitGroup
	)
	say := func(format string, args ...any) {
		out.Lock()
		fmt.Printf(format+"\n", args...)
		out.Unlock()
	}
	for _, l := range cs.Leases {
		wg.Go(func() { runClientGoElector(ctx, leases, cs.Namespace, l, cs.Identity, say) })
	}
	wg.Wait()
	return nil
}

func runClientGoElector(ctx context.Context, leases coordinationv1client.LeasesGetter, ns, lease, identity string, say func(string, ...any)) {
	for ctx.Err() == nil {
		clientgole.RunOrDie(ctx, clientgole.LeaderElectionConfig{
			Lock: &rl.LeaseLock{
				LeaseMeta:  metav1.ObjectMeta{Namespace: ns, Name: lease},
				Client:     leases,
				LockConfig: rl.ResourceLockConfig{Identity: identity},
			},
			LeaseDuration: *leaseDuration, RenewDeadline: *renewDeadline, RetryPeriod: *retryPeriod,
			ReleaseOnCancel: true,
			Callbacks: clientgole.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { say("led %s %d", lease, time.Now().UnixNano()) },
				OnStoppedLeading: func() {
					if ctx.Err() == nil {
						say("lost %s", lease)
					} else {
						say("stopped %s", lease)
					}
				},
			},
		})
	}
}
