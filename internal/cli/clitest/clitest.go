// Package clitest has the helpers the tests of handoff's commands share:
// the pod's token, as the install step writes it, and a worker keyed with
// it.
package clitest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// TokenFile writes a token file as the install step does (64 hex digits,
// mode 0440, the install step's default) in a temporary directory and returns its path.
func TokenFile(t testing.TB) string {
	t.Helper()
	var b [32]byte
	_, _ = rand.Read(b[:])
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(hex.EncodeToString(b[:])+"\n"), 0o440); err != nil {
		t.Fatal(err)
	}
	return path
}

// TokenAgent writes a token file (TokenFile) and returns its path, its
// token and a Go worker Agent keyed with it, as an injected worker's.
func TokenAgent(t testing.TB) (path, token string, agent *worker.Agent) {
	t.Helper()
	path = TokenFile(t)
	token, err := protocol.ReadTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if agent, err = worker.New(worker.Options{Token: token}); err != nil {
		t.Fatal(err)
	}
	return path, token, agent
}

// ProbeClient probes as the kubelet does: a new connection each time, a
// 1 s timeout (timeoutSeconds' default), from 127.0.0.1.
var ProbeClient = &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}

// Probe GETs /healthz at addr (host:port) with ProbeClient; nil when it
// answers 200, else the error or the status.
func Probe(addr string) error {
	resp, err := ProbeClient.Get("http://" + addr + "/healthz")
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// Deployment is a Deployment manifest (YAML) of one worker container,
// labelled for injection, whose handoff.dev/fallback annotation is
// fallback: the input of the inject command's tests.
func Deployment(fallback string) string {
	return strings.Replace(deployment, "%s", fallback, 1)
}

const deployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: orders}
spec:
  selector: {matchLabels: {app: orders}}
  template:
    metadata:
      labels: {app: orders}
      annotations: {handoff.dev/inject: "true", handoff.dev/fallback: %s}
    spec:
      containers: [{name: worker, image: orders:1}]
`
