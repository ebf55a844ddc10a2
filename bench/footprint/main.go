// Command footprint measures the memory of the handoff sidecar idle with
// one Lease beside the floor: a program that only builds a client-go
// clientset and runs one client-go leader elector with a LeaseLock at the
// same timings (bench/footprint/floor), in the same run, on a real
// kube-apiserver and etcd (envtest).
//
// For each process, after -settle idle and leading: RSS, PSS and anonymous
// memory from /proc/<pid>/smaps_rollup (the median of -samples readings
// 1 s apart), with nothing asked of the processes meanwhile; then, for the
// sidecar, its Go heap and stacks from its own /metrics (one uncompressed
// scrape), and its RSS after -scrapes more scrapes asked as Prometheus asks
// them (Accept-Encoding: gzip), the state of a monitored sidecar. Then the
// target line: sidecar RSS <= floor + 2 MiB, idle. A second floor, the same
// program built with -tags metrics, also serves prometheus/client_golang's
// default registry: the line after the target splits the sidecar's excess
// into that library's share and the rest.
//
// Usage: go run ./bench/footprint --handoff bin/handoff [-settle 15s]
// [-variant label=path ...] (more sidecar binaries, measured alike)
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/bench/internal/benchenv"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/procstat"
	"github.com/handoff-dev/handoff/worker"
)

// flags are the command's own: imported libraries register theirs on
// flag.CommandLine, which this command does not read.
var flags = flag.NewFlagSet(os.Args[0], flag.ExitOnError)

var (
	handoff         = flags.String("handoff", "bin/handoff", "the handoff binary (make build)")
	floorBin        = flags.String("floor", "", "the floor program; empty builds ./bench/footprint/floor as make build builds bin/handoff")
	floorMetricsBin = flags.String("floor-metrics", "", "the floor program built with -tags metrics; empty builds it")
	settle          = flags.Duration("settle", 15*time.Second, "idle time, leading, before measuring (at least 10s)")
	samples         = flags.Int("samples", 5, "readings 1 s apart; the median of each figure is printed")
	scrapes         = flags.Int("scrapes", 3, "scrapes of each sidecar's /metrics with Accept-Encoding: gzip, 1 s apart, before the last RSS reading")
	variants        multi
)

func init() {
	flags.Var(&variants, "variant", "label=path[ NAME=VALUE...]: another sidecar binary (and environment) measured alike; repeatable")
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ";") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// target is the bound: the sidecar's RSS at most the floor's plus this.
const target = 2.0 // MiB

const namespace = "bench"

func main() {
	flags.Usage = func() {
		fmt.Fprintf(flags.Output(), "Usage: %s [flags]\n\nStarts its own kube-apiserver and etcd (binaries from KUBEBUILDER_ASSETS, or\nbuilt by hack/kube-assets.sh), runs the handoff sidecar with one Lease and the\nclient-go floor program with one Lease, and prints their memory.\n\n", os.Args[0])
		flags.PrintDefaults()
	}
	_ = flags.Parse(os.Args[1:]) // ExitOnError
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "footprint:", err)
		os.Exit(1)
	}
}

// proc is one measured process.
type proc struct {
	label   string
	cmd     *exec.Cmd
	metrics string // the sidecar's metrics address; empty for the floor
	exited  chan struct{}
	err     error
}

func run() error {
	if *settle < 10*time.Second {
		return fmt.Errorf("-settle: %s is under 10s", *settle)
	}
	if *samples < 1 {
		return fmt.Errorf("-samples: %d is not a positive count", *samples)
	}
	if _, err := os.Stat(*handoff); err != nil {
		return fmt.Errorf("%w (build it with make build)", err)
	}
	dir, err := os.MkdirTemp("", "handoff-footprint-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	floor, floorMetrics := *floorBin, *floorMetricsBin
	if floor == "" {
		if floor, err = buildFloor(dir, "floor"); err != nil {
			return err
		}
	}
	if floorMetrics == "" {
		if floorMetrics, err = buildFloor(dir, "floor-metrics", "-tags", "metrics"); err != nil {
			return err
		}
	}

	env, stop, err := benchenv.Start()
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	app, err := startApp()
	if err != nil {
		return err
	}

	type spec struct {
		label, path string
		env         []string
	}
	sidecars := []spec{{label: "sidecar", path: *handoff}}
	for _, v := range variants {
		label, rest, ok := strings.Cut(v, "=")
		fields := strings.Fields(rest)
		if !ok || label == "" || len(fields) == 0 {
			return fmt.Errorf("-variant: %q is not label=path[ NAME=VALUE...]", v)
		}
		sidecars = append(sidecars, spec{label: label, path: fields[0], env: fields[1:]})
	}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	for _, f := range []struct{ label, path, lease string }{{"client-go floor", floor, "floor"}, {"+ client_golang", floorMetrics, "floor-metrics"}} {
		fp, err := startFloor(env, f.label, f.path, f.lease)
		if err != nil {
			return err
		}
		procs = append(procs, fp)
	}
	for i, s := range sidecars {
		p, err := startSidecar(env, app, fmt.Sprintf("footprint-%d", i), s.label, s.path, s.env)
		if err != nil {
			return err
		}
		procs = append(procs, p)
	}

	time.Sleep(*settle)
	readings := make([]map[string][]float64, len(procs))
	for i := range *samples {
		if i > 0 {
			time.Sleep(time.Second)
		}
		for j, p := range procs {
			select {
			case <-p.exited:
				return fmt.Errorf("%s exited: %w", p.label, p.err)
			default:
			}
			m, err := p.read()
			if err != nil {
				return fmt.Errorf("%s: %w", p.label, err)
			}
			if readings[j] == nil {
				readings[j] = map[string][]float64{}
			}
			for k, v := range m {
				readings[j][k] = append(readings[j][k], v)
			}
		}
	}

	// After the idle readings: the heap from one uncompressed scrape, then
	// the RSS after scrapes as Prometheus makes them.
	scraped := make([]float64, len(procs))
	for j, p := range procs {
		if p.metrics == "" {
			continue
		}
		g, err := gauges("http://"+p.metrics+"/metrics", false, "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes")
		if err != nil {
			return fmt.Errorf("%s: %w", p.label, err)
		}
		readings[j]["heap"], readings[j]["stacks"] = []float64{g[0] / (1 << 20)}, []float64{g[1] / (1 << 20)}
	}
	for i := range *scrapes {
		if i > 0 {
			time.Sleep(time.Second)
		}
		for _, p := range procs {
			if p.metrics != "" {
				if _, err := gauges("http://"+p.metrics+"/metrics", true, "go_memstats_heap_inuse_bytes"); err != nil {
					return fmt.Errorf("%s: %w", p.label, err)
				}
			}
		}
	}
	if *scrapes > 0 {
		time.Sleep(time.Second)
		for j, p := range procs {
			if p.metrics == "" {
				continue
			}
			m, err := procstat.Rollup(p.cmd.Process.Pid)
			if err != nil {
				return fmt.Errorf("%s: %w", p.label, err)
			}
			scraped[j] = m["Rss"]
		}
	}

	fmt.Printf("Footprint, idle with 1 Lease (settled %s, leading; median of %d readings; lease duration 15s,\nrenew deadline 10s, retry period 2s). MiB; RSS, PSS, anonymous from /proc/<pid>/smaps_rollup,\nGo heap in use and stacks from the sidecar's /metrics after them, then RSS after %d gzip scrapes.\n", *settle, *samples, *scrapes)
	fmt.Printf("  %-16s %6s %6s %6s %6s %6s %8s %7s %8s\n", "process", "RSS", "PSS", "anon", "file", "peak", "heap", "stacks", "scraped")
	med := make([]map[string]float64, len(procs))
	for j, p := range procs {
		med[j] = map[string]float64{}
		for k, vs := range readings[j] {
			med[j][k] = median(vs)
		}
		m := med[j]
		heap, stacks, after := "-", "-", "-"
		if p.metrics != "" {
			heap, stacks = fmt.Sprintf("%.1f", m["heap"]), fmt.Sprintf("%.1f", m["stacks"])
			if *scrapes > 0 {
				after = fmt.Sprintf("%.1f", scraped[j])
			}
		}
		fmt.Printf("  %-16s %6.1f %6.1f %6.1f %6.1f %6.1f %8s %7s %8s\n", p.label, m["Rss"], m["Pss"], m["Anonymous"], m["Rss"]-m["Anonymous"], m["VmHWM"], heap, stacks, after)
	}
	floorRSS, metricsRSS, sideRSS := med[0]["Rss"], med[1]["Rss"], med[2]["Rss"]
	verdict := "PASS"
	if sideRSS > floorRSS+target {
		verdict = "FAIL"
	}
	fmt.Printf("sidecar RSS <= floor + %.0f MiB: %s (%.1f vs %.1f MiB)\n", target, verdict, sideRSS, floorRSS)
	fmt.Printf("  of the sidecar's %+.1f MiB: prometheus/client_golang alone %+.1f (the floor serving its default registry), the rest %+.1f\n",
		sideRSS-floorRSS, metricsRSS-floorRSS, sideRSS-metricsRSS)
	return nil
}

// read returns the process's smaps_rollup and its peak RSS (VmHWM), in
// MiB, from /proc alone: nothing is asked of the process.
func (p *proc) read() (map[string]float64, error) {
	pid := p.cmd.Process.Pid
	m, err := procstat.Rollup(pid)
	if err != nil {
		return nil, err
	}
	st, err := procstat.Memory(pid)
	if err != nil {
		return nil, err
	}
	m["VmHWM"] = st["VmHWM"]
	return m, nil
}

func startSidecar(env *kubetest.Env, app, name, label, path string, extra []string) (*proc, error) {
	_, tokenFile, err := benchenv.PodToken()
	if err != nil {
		return nil, err
	}
	grace := int64(30)
	pod, err := env.Client.CoreV1().Pods(namespace).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{NodeName: "bench-node", TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "worker", Image: "worker"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	control, err := freeAddr()
	if err != nil {
		return nil, err
	}
	metrics, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, "sidecar")
	cmd.Env = append(os.Environ(),
		"HANDOFF_POD_NAME="+name, "HANDOFF_POD_NAMESPACE="+namespace, "HANDOFF_POD_UID="+string(pod.UID),
		"HANDOFF_LEASES="+name, "HANDOFF_KUBECONFIG="+env.Kubeconfig,
		"HANDOFF_CONTROL_ADDR="+control, "HANDOFF_METRICS_ADDR="+metrics, "HANDOFF_APP_URL=http://"+app,
		"HANDOFF_TOKEN_FILE="+tokenFile)
	cmd.Env = append(cmd.Env, extra...)
	p, err := start(label, cmd)
	if err != nil {
		return nil, err
	}
	p.metrics = metrics
	return p, p.waitHeld(env, name, name)
}

// buildFloor builds ./bench/footprint/floor into dir/name as make build
// builds bin/handoff, with the extra go build flags, and returns its path.
func buildFloor(dir, name string, extra ...string) (string, error) {
	out := filepath.Join(dir, name)
	args := append([]string{"build", "-trimpath", "-ldflags", "-s -w", "-o", out}, extra...)
	build := exec.Command("go", append(args, "./bench/footprint/floor")...)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building the floor program %s: %w", name, err)
	}
	return out, nil
}

func startFloor(env *kubetest.Env, label, path, lease string) (*proc, error) {
	cmd := exec.Command(path, "-kubeconfig", env.Kubeconfig, "-namespace", namespace, "-lease", lease, "-identity", lease)
	p, err := start(label, cmd)
	if err != nil {
		return nil, err
	}
	return p, p.waitHeld(env, lease, lease)
}

func start(label string, cmd *exec.Cmd) (*proc, error) {
	log, err := os.CreateTemp("", "handoff-footprint-*.log")
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	benchenv.AtExit(func() { _ = cmd.Process.Kill() })
	p := &proc{label: label, cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
		_ = log.Close()
		_ = os.Remove(log.Name())
	}()
	return p, nil
}

// waitHeld waits until the Lease's holder identity names the process's own
// (the sidecar's is the pod name followed by its UID).
func (p *proc) waitHeld(env *kubetest.Env, lease, holder string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		l, err := env.Client.CoordinationV1().Leases(namespace).Get(context.Background(), lease, metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil && strings.HasPrefix(*l.Spec.HolderIdentity, holder) {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited: %w", p.label, p.err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not hold Lease %s within 30s", p.label, lease)
}

// stop sends SIGTERM and waits for the exit, killing after 30 s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// gauges reads the named unlabelled samples from a Prometheus text page,
// asked for with Accept-Encoding: gzip (as Prometheus asks) when gzip,
// uncompressed otherwise.
func gauges(url string, gzip bool, names ...string) ([]float64, error) {
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableCompression: !gzip}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New(resp.Status)
	}
	out := make([]float64, len(names))
	found := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if i := slices.Index(names, name); ok && i >= 0 {
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			out[i] = v
			found++
		}
	}
	if found != len(names) {
		return nil, fmt.Errorf("%s: not all of %v found", url, names)
	}
	return out, sc.Err()
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	return s[len(s)/2]
}

// startApp serves the worker library's endpoints with nothing in flight;
// it runs until the command exits.
func startApp() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	podToken, _, err := benchenv.PodToken()
	if err != nil {
		return "", err
	}
	agent, err := worker.New(worker.Options{Token: podToken})
	if err != nil {
		return "", err
	}
	go func() { _ = http.Serve(l, agent.Handler()) }()
	return l.Addr().String(), nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}
