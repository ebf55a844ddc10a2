// Package benchenv starts the control plane of a benchmark command and
// makes sure nothing it started outlives the command, even when it is
// interrupted (Ctrl-C, SIGTERM, or a closed output pipe).
package benchenv

import (
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

// Start starts a kube-apiserver and etcd (kubetest.Start) and returns them
// with the func that stops them and everything registered with AtExit.
// SIGINT, SIGTERM and SIGPIPE run that func and exit with status 130.
func Start() (*kubetest.Env, func(), error) {
	env, stopKube, err := kubetest.Start()
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
