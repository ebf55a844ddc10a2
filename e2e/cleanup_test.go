//go:build e2e

package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cleanups are run once, last added first: at the end of the run; or on
// SIGINT or SIGTERM, when go test exits before this process, or a minute
// before go test's -timeout would kill it. Commands run through output, in
// process groups of their own, so a terminal's ^C reaches only this
// process, which stops them and cleans up; a second ^C cannot cut a
// cleanup short.
type cleanups struct {
	started atomic.Bool
	once    sync.Once
	mu      sync.Mutex
	fns     []func()
	running map[*exec.Cmd]bool
}

func (c *cleanups) add(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fns = append(c.fns, f)
}

// run runs the cleanups; a second call waits for the first to finish.
func (c *cleanups) run() {
	c.started.Store(true)
	c.once.Do(func() {
		c.mu.Lock()
		fns := slices.Clone(c.fns)
		c.mu.Unlock()
		for _, f := range slices.Backward(fns) {
			f()
		}
	})
}

// output is cmd.Output, in a process group of its own.
func (c *cleanups) output(cmd *exec.Cmd) ([]byte, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.mu.Lock()
	if c.running == nil {
		c.running = map[*exec.Cmd]bool{}
	}
	c.running[cmd] = true
	c.mu.Unlock()
	defer func() { c.mu.Lock(); delete(c.running, cmd); c.mu.Unlock() }()
	return cmd.Output()
}

// stopOnInterrupt watches for the interruptions above; on one it kills the
// process groups of the commands running, runs the cleanups and exits 1.
func (c *cleanups) stopOnInterrupt() {
	// With go test gone, writes to its pipe must fail, not kill us.
	signal.Ignore(syscall.SIGPIPE)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	var beforeTimeout <-chan time.Time
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && d > 2*time.Minute {
			beforeTimeout = time.After(d - time.Minute)
		}
	}
	parent := os.Getppid()
	orphaned := make(chan struct{})
	go func() {
		for os.Getppid() == parent {
			time.Sleep(time.Second)
		}
		close(orphaned)
	}()
	go func() {
		select {
		case s := <-signals:
			fmt.Fprintf(os.Stderr, "e2e: %v: stopping the cluster and PostgreSQL\n", s)
		case <-orphaned:
			fmt.Fprintln(os.Stderr, "e2e: go test is gone: stopping the cluster and PostgreSQL")
		case <-beforeTimeout:
			fmt.Fprintln(os.Stderr, "e2e: a minute before the test timeout: stopping the cluster and PostgreSQL")
		}
		c.mu.Lock()
		for cmd := range c.running {
			if c.started.Load() {
				break // the cleanups' own commands run: let them finish
			}
			if cmd.Process != nil {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			}
		}
		c.mu.Unlock()
		c.run()
		os.Exit(1)
	}()
}

// removeNamespaces uninstalls the chart and deletes the namespaces, and
// waits up to a minute for them to go: the next run creates them again.
func removeNamespaces(helm func(args ...string) (string, error), names ...string) {
	ctx := context.Background()
	_, _ = helm("uninstall", "handoff", "--namespace", "handoff", "--wait", "--timeout", "1m")
	for _, ns := range names {
		_ = cluster.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		gone := 0
		for _, ns := range names {
			if _, err := cluster.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				gone++
			}
		}
		if gone == len(names) {
			return
		}
	}
	fmt.Fprintf(os.Stderr, "e2e: namespaces %v still there a minute after their deletion\n", names)
}
