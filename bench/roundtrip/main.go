// Command roundtrip measures the sidecar's calls to the app, per SDK: each
// app (the Go worker package's, and each command given with -app) is
// started as its own process serving the app API on a Unix socket, as in
// an injected pod, and called with the sidecar's own client
// (protocol.AppClient, signed) -n times each: a leadership grant (with a
// growing sequence), the drain status (waitMillis 0), and stop-claiming
// (after the first, answered at once as the rest: it is idempotent). It
// prints, for each app and call, p50 and p99 beside Go's from the same run,
// and the target: each SDK within 2 ms of Go at p99.
//
//	call           app     p50      p99      p99 - Go's  target (≤ 2ms)
//	grant          go      95µs     180µs    -           -
//	grant          python  310µs    820µs    640µs       ok
//
// An app command is run with HANDOFF_APP_URL (unix:///DIR/app.sock),
// HANDOFF_TOKEN_FILE and HANDOFF_LEASE_DURATION (15s) set, and must serve
// the app API there, idle, until it is killed.
//
// Usage: go run ./bench/roundtrip [-n 2000] [-app 'python=python3 sdk/python/examples/idle.py' ...]
// (scripts/roundtrip.sh runs it with the repository's SDKs).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/handoff-dev/handoff/bench/internal/stats"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// target is how far above Go's p99 an SDK's may be.
const target = 2 * time.Millisecond

type apps []string

func (a *apps) String() string     { return strings.Join(*a, ", ") }
func (a *apps) Set(v string) error { *a = append(*a, v); return nil }

var (
	n      = flag.Int("n", 2000, "calls of each kind per app (and 200 more first, to warm up)")
	others apps
	serve  = flag.Bool("serve-go", false, "internal: serve the Go worker package's app API at $HANDOFF_APP_URL until killed")
)

func main() {
	flag.Var(&others, "app", "NAME=COMMAND: an app to measure beside Go's, run with sh -c (repeatable)")
	flag.Parse()
	if *serve {
		if err := serveGo(); err != nil {
			fmt.Fprintln(os.Stderr, "roundtrip:", err)
			os.Exit(1)
		}
		return
	}
	if *n < 100 || *n > 1_000_000 {
		fmt.Fprintln(os.Stderr, "roundtrip: -n: want 100 to 1000000 calls")
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "roundtrip:", err)
		os.Exit(1)
	}
}

// serveGo is the Go app: package worker's Agent, idle.
func serveGo() error {
	a, err := worker.New(worker.Options{})
	if err != nil {
		return err
	}
	return a.ListenAndServe(context.Background(), "")
}

// result is one app's calls.
type result struct {
	name  string
	calls map[string][]time.Duration
}

var callNames = []string{"grant", "drain", "stop-claiming"}

func run() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	list := append([]string{"go=" + self + " -serve-go"}, others...)
	var results []result
	for _, spec := range list {
		name, cmd, ok := strings.Cut(spec, "=")
		if !ok || name == "" || cmd == "" {
			return fmt.Errorf("-app %q: want NAME=COMMAND", spec)
		}
		r, err := measure(name, cmd)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		results = append(results, r)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "call\tapp\tp50\tp99\tp99 - Go's\ttarget (≤ %s)\n", target)
	failed := false
	for _, call := range callNames {
		goP99 := stats.Percentile(results[0].calls[call], 99)
		for _, r := range results {
			d := r.calls[call]
			p50, p99 := stats.Percentile(d, 50), stats.Percentile(d, 99)
			diff, verdict := "-", "-"
			if r.name != "go" {
				diff = stats.Round(p99 - goP99).String()
				verdict = "ok"
				if p99-goP99 > target {
					verdict, failed = "MISSED", true
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", call, r.name, stats.Round(p50), stats.Round(p99), diff, verdict)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Printf("%d calls of each kind per app, after 200 to warm up; one client, one call at a time, on a Unix socket\n", *n)
	if failed {
		return errors.New("an SDK is more than 2ms above Go's p99")
	}
	return nil
}

// measure starts the app command on a socket of its own, calls it, and
// stops it.
func measure(name, command string) (result, error) {
	dir, err := os.MkdirTemp("", "rt")
	if err != nil {
		return result{}, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	token := strings.Repeat("7f", 32)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return result{}, err
	}
	sock := filepath.Join(dir, "app.sock")
	e := protocol.Endpoint{Network: "unix", Address: sock}
	cmd := exec.Command("sh", "-c", "exec "+command)
	cmd.Env = append(os.Environ(), protocol.AppURLEnv+"="+e.String(), protocol.TokenFileEnv+"="+tokenFile, protocol.LeaseDurationEnv+"=15s")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if fi, err := os.Lstat(sock); err == nil && fi.Mode().Type() == fs.ModeSocket {
			break
		}
		if time.Now().After(deadline) {
			return result{}, fmt.Errorf("no socket at %s within 30s of starting %q", sock, command)
		}
	}
	c := protocol.NewAppClient(e, token)
	ctx := context.Background()
	seq := time.Now().UnixNano()
	calls := map[string]func() error{
		"grant": func() error {
			seq++
			now := time.Now()
			return c.SetLeadership(ctx, protocol.Leadership{Lease: "bench", Leader: true, Sequence: max(seq, now.UnixNano()),
				HolderIdentity: "bench_1", FencingToken: 1, Until: now.Add(10 * time.Second), ValidForMillis: 10_000})
		},
		"drain": func() error { _, err := c.Drain(ctx, 0); return err },
		"stop-claiming": func() error {
			_, err := c.StopClaiming(ctx)
			return err
		},
	}
	r := result{name: name, calls: map[string][]time.Duration{}}
	// Grants and drains first: stop-claiming is one-way, and an app that
	// has stopped claiming still answers both.
	for _, call := range callNames {
		f := calls[call]
		for i := range 200 + *n {
			start := time.Now()
			if err := f(); err != nil {
				return result{}, fmt.Errorf("%s, call %d: %w", call, i, err)
			}
			if i >= 200 {
				r.calls[call] = append(r.calls[call], time.Since(start))
			}
		}
	}
	return r, nil
}
