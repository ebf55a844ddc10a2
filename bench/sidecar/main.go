// Command sidecar measures the handoff sidecar process as users run it, on
// a real kube-apiserver and etcd (envtest), with an app (the worker
// library) that answers at once:
//
//   - binary size;
//   - resident memory and CPU while idle holding 1 Lease and 100 Leases;
//   - the shutdown sequence's own time (preStop to report, the app
//     draining at once), over -shutdowns runs.
//
// Usage: go run ./bench/sidecar --handoff bin/handoff [-window 60s]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/bench/internal/benchenv"
	"github.com/handoff-dev/handoff/bench/internal/stats"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/procstat"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// flags are the command's own: imported libraries register theirs on
// flag.CommandLine (controller-runtime's -kubeconfig), which this command does not read.
var flags = flag.NewFlagSet(os.Args[0], flag.ExitOnError)

var (
	handoff   = flags.String("handoff", "bin/handoff", "the handoff binary (make build)")
	image     = flags.String("image", "", "the image tarball (make image), to print its size")
	window    = flags.Duration("window", time.Minute, "how long idle CPU is measured")
	settle    = flags.Duration("settle", 10*time.Second, "idle time before measuring")
	shutdowns = flags.Int("shutdowns", 50, "shutdown sequences timed")
	leases    = flags.String("leases", "1,100", "Lease counts measured idle")
)

const namespace = "bench"

func main() {
	flags.Usage = func() {
		fmt.Fprintf(flags.Output(), "Usage: %s [flags]\n\nStarts its own kube-apiserver and etcd (binaries from KUBEBUILDER_ASSETS, or\nbuilt by hack/kube-assets.sh), runs the handoff sidecar binary against them\nand prints its size, idle memory and CPU, and shutdown-sequence time.\n\n", os.Args[0])
		flags.PrintDefaults()
	}
	_ = flags.Parse(os.Args[1:]) // ExitOnError
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sidecar:", err)
		os.Exit(1)
	}
}

func run() error {
	fi, err := os.Stat(*handoff)
	if err != nil {
		return fmt.Errorf("%w (build it with make build)", err)
	}
	fmt.Printf("Binary %s: %.1f MiB\n", *handoff, float64(fi.Size())/(1<<20))
	if *image != "" {
		size, err := imageSize(*image)
		if err != nil {
			return err
		}
		fmt.Printf("Image %s: %.1f MiB compressed (what a node pulls)\n", *image, float64(size)/(1<<20))
	}
	fmt.Println()

	env, stop, err := benchenv.Start()
	if err != nil {
		return err
	}
	defer stop()
	if _, err := env.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	app, err := startApp()
	if err != nil {
		return err
	}
	b := &bench{env: env, app: app}

	fmt.Printf("Idle sidecar (settled %s, CPU over %s; lease duration 15s, renew deadline 10s, retry period 2s;\ntargets with 1 Lease: RSS <= 25 MiB, CPU <= 1 millicore)\n", *settle, *window)
	for _, f := range strings.Split(*leases, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-leases: %q is not a positive count", f)
		}
		if err := b.idle(n); err != nil {
			return err
		}
	}

	fmt.Printf("\nShutdown sequence, preStop to report, app drains at once (%d runs; target <= 50ms)\n", *shutdowns)
	var took []time.Duration
	steps := map[protocol.StepName][]time.Duration{}
	var order []protocol.StepName
	for i := range *shutdowns {
		rep, err := b.shutdown(i)
		if err != nil {
			return err
		}
		took = append(took, rep.Finished.Sub(rep.Started))
		for _, s := range rep.Steps {
			if _, ok := steps[s.Name]; !ok {
				order = append(order, s.Name)
			}
			steps[s.Name] = append(steps[s.Name], s.At.Sub(rep.Started))
		}
	}
	fmt.Printf("  total      %s\n", stats.Summary(took))
	for _, name := range order {
		fmt.Printf("  %-19s since trigger: %s\n", name, stats.Summary(steps[name]))
	}
	return nil
}

type bench struct {
	env  *kubetest.Env
	app  string
	pods int
}

// sidecar is one running handoff sidecar process.
type sidecar struct {
	cmd     *exec.Cmd
	control string
	exited  chan struct{} // closed once err is set
	err     error
}

// start runs handoff sidecar for a new Pod object holding the given Leases.
func (b *bench) start(leases []string) (*sidecar, error) {
	b.pods++
	name := fmt.Sprintf("worker-%d", b.pods)
	grace := int64(30)
	pod, err := b.env.Client.CoreV1().Pods(namespace).Create(context.Background(), &corev1.Pod{
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
	cmd := exec.Command(*handoff, "sidecar")
	cmd.Env = append(os.Environ(),
		"HANDOFF_POD_NAME="+name, "HANDOFF_POD_NAMESPACE="+namespace, "HANDOFF_POD_UID="+string(pod.UID),
		"HANDOFF_LEASES="+strings.Join(leases, ","), "HANDOFF_KUBECONFIG="+b.env.Kubeconfig,
		"HANDOFF_CONTROL_ADDR="+control, "HANDOFF_METRICS_ADDR=127.0.0.1:0", "HANDOFF_APP_URL=http://"+b.app)
	log, err := os.Create(filepath.Join(os.TempDir(), "handoff-bench-"+name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	benchenv.AtExit(func() { _ = cmd.Process.Kill() })
	s := &sidecar{cmd: cmd, control: control, exited: make(chan struct{})}
	go func() {
		s.err = cmd.Wait()
		close(s.exited)
		_ = log.Close()
		_ = os.Remove(log.Name())
	}()
	return s, s.waitLeading(len(leases))
}

func (s *sidecar) waitLeading(n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if st, err := status(s.control); err == nil {
			leading := 0
			for _, l := range st.Leases {
				if l.Leader {
					leading++
				}
			}
			if leading == n {
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("sidecar exited: %w", s.err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	s.stop()
	return fmt.Errorf("sidecar did not lead its %d Leases within 30s", n)
}

// stop sends SIGTERM and waits for the exit. The Pod is not being
// deleted, so the sidecar exits keeping its Leases, as for a restart of its
// container (each run uses Leases of its own).
func (s *sidecar) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

func (b *bench) idle(n int) error {
	leases := make([]string, n)
	for i := range leases {
		leases[i] = fmt.Sprintf("idle-%d-%d", n, i)
	}
	s, err := b.start(leases)
	if err != nil {
		return err
	}
	defer s.stop()
	time.Sleep(*settle)
	pid := s.cmd.Process.Pid
	cpu0, err := cpuTime(pid)
	if err != nil {
		return err
	}
	t0 := time.Now()
	time.Sleep(*window)
	cpu1, err := cpuTime(pid)
	if err != nil {
		return err
	}
	mem, err := procstat.Memory(pid)
	if err != nil {
		return err
	}
	millicores := float64(cpu1-cpu0) / float64(time.Since(t0)) * 1000
	fmt.Printf("  %3d Lease(s): RSS %5.1f MiB (anonymous %.1f, file-backed %.1f; peak %.1f), CPU %5.2f millicores\n",
		n, mem["VmRSS"], mem["RssAnon"], mem["RssFile"], mem["VmHWM"], millicores)
	return nil
}

func (b *bench) shutdown(i int) (*protocol.Report, error) {
	s, err := b.start([]string{fmt.Sprintf("shutdown-%d", i)})
	if err != nil {
		return nil, err
	}
	defer s.stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tok, _, err := benchenv.PodToken()
	if err != nil {
		return nil, err
	}
	return prestop.Call(ctx, tcp(s.control), tok, 5*time.Second)
}

// startApp serves the worker library's endpoints with nothing in flight,
// so every drain is immediate; it runs until the command exits.
func startApp() (string, error) {
	// The sidecars inherit HANDOFF_TOKEN_FILE.
	podToken, file, err := benchenv.PodToken()
	if err != nil {
		return "", err
	}
	if err := os.Setenv(protocol.TokenFileEnv, file); err != nil {
		return "", err
	}
	agent, err := worker.New(worker.Options{Token: podToken})
	if err != nil {
		return "", err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
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

// imageSize is the sum of the compressed layers of a docker-archive tarball.
func imageSize(path string) (int64, error) {
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		return 0, err
	}
	layers, err := img.Layers()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// cpuTime is the user plus system CPU time of pid and its threads, from
// /proc/<pid>/stat (clock ticks of 10 ms).
func cpuTime(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}
