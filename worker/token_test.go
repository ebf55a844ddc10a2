package worker_test

import (
	"testing"

	"github.com/handoff-dev/handoff/worker"
)

// testToken is the pod's token in these tests.
const testToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// newAgent is worker.New with the test token.
func newAgent(t testing.TB, o worker.Options) *worker.Agent {
	t.Helper()
	o.Token = testToken
	a, err := worker.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
