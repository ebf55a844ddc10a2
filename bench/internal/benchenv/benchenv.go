// Package benchenv starts the control plane of a benchmark command and
// makes sure nothing it started outlives the command, even when it is
// interrupted (Ctrl-C, SIGTERM, or a closed output pipe).
package benchenv

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/handoff-dev/handoff/internal/kubetest"
)

var (
	mu       sync.Mutex
	cleanups []func()
)

// Start starts a kube-apiserver and etcd (kubetest.StartServer) and returns
// them with the func that stops them and everything registered with AtExit.
// SIGINT, SIGTERM and SIGPIPE run that func and exit with status 130.
func Start() (*kubetest.Env, func(), error) {
	env, stopKube, err := kubetest.StartServer()
	if err != nil {
		return nil, nil, err
	}
	AtExit(stopKube)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		})
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE)
	go func() {
		<-sig
		stop()
		os.Exit(130)
	}()
	return env, stop, nil
}

// AtExit registers f to run when the command stops or is interrupted, after
// the ones registered later.
func AtExit(f func()) {
	mu.Lock()
	cleanups = append(cleanups, f)
	mu.Unlock()
}

var (
	tokenOnce sync.Once
	token     string
	tokenPath string
	tokenErr  error
)

// PodToken returns the pod's token that every sidecar and app a benchmark
// starts share (random, as handoff install writes it in a real pod) and
// the path of the file that holds it, for HANDOFF_TOKEN_FILE. The file is
// written on the first call and removed at exit.
func PodToken() (tok, path string, err error) {
	tokenOnce.Do(func() {
		b := make([]byte, 32)
		if _, tokenErr = rand.Read(b); tokenErr != nil {
			return
		}
		f, err := os.CreateTemp("", "handoff-bench-token-*")
		if err != nil {
			tokenErr = err
			return
		}
		AtExit(func() { _ = os.Remove(f.Name()) })
		token, tokenPath = hex.EncodeToString(b), f.Name()
		if _, err := f.WriteString(token); err != nil {
			tokenErr = err
		}
		if err := f.Close(); err != nil && tokenErr == nil {
			tokenErr = err
		}
	})
	return token, tokenPath, tokenErr
}
