package sidecar

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/serve"
	"github.com/handoff-dev/handoff/protocol"
	coord "github.com/handoff-dev/handoff/sidecar"
)

// The sidecar does not start without the pod's token.
func TestSidecarRefusesToStartWithoutAToken(t *testing.T) {
	for _, tc := range []struct {
		file, want string
	}{
		{"", "token-file: required"},
		{filepath.Join(t.TempDir(), "missing"), "no such file"},
	} {
		t.Setenv(protocol.TokenFileEnv, "")
		if err := command.Execute(context.Background(), Command, []string{"--pod-name=p", "--pod-namespace=n", "--token-file=" + tc.file}, nil, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
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
	srv, err := serve.Listen("127.0.0.1:0", coord.ProbesHandler(prometheus.NewRegistry(), nil), logr.Discard(), ProbeTimeouts)
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

func TestSidecarRefusesBadConfiguration(t *testing.T) {
	err := command.Execute(context.Background(), Command, []string{"--renew-deadline", "20s", "--fallback", "drop"}, nil, io.Discard, io.Discard)
	for _, want := range []string{"renew-deadline", "flag --fallback", `"drop"`, "one of return, cancel, abandon"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("sidecar error %v does not say %q", err, want)
		}
	}
}
