package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/handoff-dev/handoff/internal/cli/serve"
	clisidecar "github.com/handoff-dev/handoff/internal/cli/sidecar"
	"github.com/handoff-dev/handoff/internal/connlimit"
	"github.com/handoff-dev/handoff/internal/procstat"
	"github.com/handoff-dev/handoff/sidecar"
)

// probeServerEnv makes the test binary serve the probe port alone (the
// sidecar's listen and ProbesHandler, with a registry of the Go and process
// collectors as the sidecar's), with no connection cap and a read-header
// timeout of a minute, print its address and serve until its standard
// input closes: the server whose memory per connection
// BenchmarkIdleConnectionMemory measures.
const probeServerEnv = "HANDOFF_TEST_PROBE_SERVER"

func serveProbesUncapped() {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	t := clisidecar.ProbeTimeouts
	t.ReadHeader, t.Read = time.Minute, time.Minute
	t.Conns = connlimit.Limits{Total: 1 << 20, PerAddr: 1 << 20}
	srv, err := serve.Listen("127.0.0.1:0", sidecar.ProbesHandler(reg, nil), logr.Discard(), t)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(srv.Addr)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// idleConns is how many idle connections each round of
// BenchmarkIdleConnectionMemory opens.
const idleConns = 4000

// BenchmarkIdleConnectionMemory: what one idle TCP connection (connected,
// nothing sent) costs the process serving the probe port, the figure the
// connection caps (probeTimeouts.conns) are sized from. Each round opens
// idleConns connections from 127.0.0.2 to a server process of its own
// (probeServerEnv), waits until the server has a goroutine for each, and
// reads the server's resident memory (/proc/PID/status VmRSS) and its Go
// runtime's stacks and heap (from its /metrics) before and after; the
// metrics are the differences per connection. Kernel memory (the socket
// itself, about 2-3 KiB; charged to the container's cgroup but not in
// RSS) is not counted. Run it without the race detector, whose shadow
// memory would be counted too:
//
//	go test -run '^$' -bench IdleConnectionMemory ./cmd/handoff
func BenchmarkIdleConnectionMemory(b *testing.B) {
	if raceEnabled {
		b.Skip("the race detector's shadow memory would be counted: run without -race")
	}
	ensureFileLimit(b, idleConns+1024)
	var rss, stack, heap float64
	for b.Loop() {
		r, st, h := idleConnectionMemory(b)
		rss, stack, heap = rss+r, stack+st, heap+h
	}
	n := float64(b.N)
	b.ReportMetric(rss/n, "RSS-B/conn")
	b.ReportMetric(stack/n, "stack-B/conn")
	b.ReportMetric(heap/n, "heap-B/conn")
}

// idleConnectionMemory is one round of BenchmarkIdleConnectionMemory, on a
// server process of its own: what a flood costs a fresh sidecar, not one
// that already grew its heap and stacks for a flood before.
func idleConnectionMemory(b *testing.B) (rss, stack, heap float64) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), probeServerEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	addr = strings.TrimSpace(addr)

	before := serverMemory(b, cmd.Process.Pid, addr)
	conns := make([]net.Conn, 0, idleConns)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	for range idleConns {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Each connection has its goroutine (a few of the server's own come
	// and go: a margin of 16).
	want := before.goroutines + idleConns - 16
	deadline := time.Now().Add(30 * time.Second)
	for metric(b, addr, "go_goroutines") < want {
		if time.Now().After(deadline) {
			b.Fatalf("the server has %v goroutines after 30s; want %v", metric(b, addr, "go_goroutines"), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	after := serverMemory(b, cmd.Process.Pid, addr)
	return (after.rss - before.rss) / idleConns, (after.stack - before.stack) / idleConns, (after.heap - before.heap) / idleConns
}

type serverMem struct{ rss, stack, heap, goroutines float64 }

func serverMemory(b *testing.B, pid int, addr string) serverMem {
	b.Helper()
	m, err := procstat.Memory(pid)
	if err != nil {
		b.Fatal(err)
	}
	return serverMem{rss: m["VmRSS"] * (1 << 20), stack: metric(b, addr, "go_memstats_stack_inuse_bytes"),
		heap: metric(b, addr, "go_memstats_heap_inuse_bytes"), goroutines: metric(b, addr, "go_goroutines")}
}
