package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/worker"
)

// tokenAgent writes a token file (tokenFile) and returns its path, its
// token and a Go worker Agent keyed with it, as an injected worker's.
func tokenAgent(t *testing.T) (path, token string, agent *worker.Agent) {
	t.Helper()
	path = tokenFile(t)
	token, err := protocol.ReadTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if agent, err = worker.New(worker.Options{Token: token}); err != nil {
		t.Fatal(err)
	}
	return path, token, agent
}

// tokenFile writes a token file as the install step does and returns its
// path.
func tokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if _, err := writeToken(path, defaultTokenMode); err != nil {
		t.Fatal(err)
	}
	return path
}

// install --token-file writes 256 random bits in hex, readable by the
// worker's user, and keeps a token already there (a rerun of the init
// step keeps the pod's token); a file with no token in it is replaced.
func TestInstallWritesTheTokenOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	run := func() string {
		var out strings.Builder
		if err := runCommand(installCmd, []string{"--token-file", path}, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		tok, err := protocol.ReadTokenFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	first := run()
	if len(first) != 64 || strings.Trim(first, "0123456789abcdef") != "" {
		t.Errorf("token %q: want 64 hex digits", first)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o440 {
		t.Errorf("token file mode %v (%v): want 0440 (its owner and group alone)", fi.Mode(), err)
	}
	if again := run(); again != first {
		t.Errorf("a second install changed the token from %q to %q; want it kept", first, again)
	}
	if err := os.WriteFile(path, []byte("\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fresh := run(); fresh == first || len(fresh) != 64 {
		t.Errorf("install over an empty file: token %q; want a new one", fresh)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("%d files left in the directory; want only the token", len(entries))
	}
	if err := runCommand(installCmd, nil, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Errorf("install with nothing to do: %v; want an error naming DEST and --token-file", err)
	}
}

// The sidecar does not start without the pod's token.
func TestSidecarRefusesToStartWithoutAToken(t *testing.T) {
	for _, tc := range []struct {
		file, want string
	}{
		{"", "token-file: required"},
		{filepath.Join(t.TempDir(), "missing"), "no such file"},
	} {
		t.Setenv(protocol.TokenFileEnv, "")
		if err := runCommand(sidecarCmd, []string{"--pod-name=p", "--pod-namespace=n", "--token-file=" + tc.file}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("sidecar --token-file=%q: %v; want an error saying %q", tc.file, err, tc.want)
		}
	}
}

// A slow client on the probe port, one that sends its request a byte at a
// time, is cut off by the server's timeouts: the server closes the
// connection, however long the client would go on. Two ways: dripping the
// headers (ReadHeaderTimeout), and dripping a body after the headers
// (ReadTimeout; net/http reads an unread body to reuse the connection).
func TestSlowClientOnTheProbePortIsCutOff(t *testing.T) {
	srv, err := listen("127.0.0.1:0", sidecar.ProbesHandler(prometheus.NewRegistry(), nil, nil), logr.Discard(), probeTimeouts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	for _, tc := range []struct {
		name, start string
		answered    bool // the server answers before it cuts the body
	}{
		{"headers", "GET /healthz HTTP/1.1\r\nHost: probe\r\n", false},
		{"body", "GET /healthz HTTP/1.1\r\nHost: probe\r\nContent-Length: 100000\r\n\r\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", srv.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			if _, err := io.WriteString(conn, tc.start); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			stop := make(chan struct{})
			wg.Add(1)
			go func() { // one byte every 100ms, until the server closes
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
					if _, err := io.WriteString(conn, "x"); err != nil {
						return
					}
				}
			}()
			defer func() { close(stop); wg.Wait() }()
			// The test's own bound, far beyond the server's timeouts: a
			// server that never cuts the client fails here.
			_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
			r := bufio.NewReader(conn)
			if tc.answered {
				if resp, err := http.ReadResponse(r, nil); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			}
			_, err = io.Copy(io.Discard, r)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the connection was still open after a minute of a byte every 100ms; want the server to close it")
			}
			if err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("reading until the server closes: %v; want EOF or a reset", err)
			}
		})
	}
}
