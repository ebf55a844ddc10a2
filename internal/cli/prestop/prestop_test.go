package prestop

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/internal/cli/clitest"
	"github.com/handoff-dev/handoff/internal/cli/command"
)

func runCommand(c command.Command, args []string, out, errOut io.Writer) error {
	return command.Execute(context.Background(), c, args, nil, out, errOut)
}

func TestPrestopFailsWhenSidecarUnreachable(t *testing.T) {
	var out bytes.Buffer
	err := runCommand(Command, []string{"--addr", "127.0.0.1:1", "--connect-timeout", "100ms", "--token-file", clitest.TokenFile(t)}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "not reachable") {
		t.Fatalf("prestop = %v, want an error saying the sidecar is not reachable", err)
	}
}

// TestPrestopRefusesAddrBeyondLoopback: the hook calls only the pod's own
// sidecar, so it refuses any address the sidecar could not listen on (not
// a socket, not loopback), before it reads the token or connects.
func TestPrestopRefusesAddrBeyondLoopback(t *testing.T) {
	for _, addr := range []string{"10.0.0.1:7450", "localhost", "0.0.0.0:7450", "unix://control.sock"} {
		var out bytes.Buffer
		err := runCommand(Command, []string{"--addr", addr, "--connect-timeout", "100ms", "--token-file", clitest.TokenFile(t)}, &out, &out)
		for _, want := range []string{"flag --addr", addr, "want unix:// and an absolute socket path"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("prestop --addr %s = %v, want an error saying %q", addr, err, want)
			}
		}
	}
}
