package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// CommandFixture is a Fixture and a LeaderFixture for an app in another
// process or language (handoff conformance --fixture-cmd, --leader-cmd):
// each step runs Argv with the step's words appended,
//
//	restart          replace the app with a fresh process (Fixture.Restart); exit once it answers
//	hold N           make the app hold N claims, started, until finish (Fixture.Hold)
//	hold-cancelable N  make the app hold N claims whose work ends at the cancel fallback,
//	                 unacknowledged (CancelFixture.HoldCancelable); print "unsupported" to skip the case
//	hold-unstarted N make the app hold N claims received and not started, handed back at
//	                 stop-claiming (UnstartedFixture.HoldUnstarted); work on one the app starts
//	                 runs until finish; print "unsupported" to skip the case
//	finish           finish the claims held (Fixture.Finish)
//	lead LEASE       begin leader work for LEASE; print "yes", or "no" when the app does not lead it
//	stopping LEASE   print "yes" once the app has told that leader work to stop, else "no"
//	                 ("no" when no leader work began for LEASE)
//	release LEASE    end that leader work
//
// with no standard input, and is bounded by its context. A step exits 0
// once what it asks is done (hold: the claims counted in flight; release:
// the leader work ended). A step fails when the command exits non-zero, or
// prints anything but "yes" or "no" where one is asked; the error has the
// command's standard error. docs/protocol.md, "The fixture contract", is
// the contract in full; ServeFixture and FixtureMain are its app side in Go
// (the Python, Node and Ruby SDKs' testing modules have theirs).
type CommandFixture struct {
	// Argv is the program and its first arguments, like
	// []string{"sh", "-c", `./fixture "$@"`, "sh"}.
	Argv []string
	// Env, if set, is the command's environment (os/exec.Cmd.Env).
	Env []string
	// Name, if set, is what errors call the command (handoff conformance
	// gives its --fixture-cmd); Argv[0] otherwise.
	Name string
}

func (c CommandFixture) name() string {
	if c.Name != "" {
		return c.Name
	}
	return c.Argv[0]
}

var (
	_ Fixture          = CommandFixture{}
	_ LeaderFixture    = CommandFixture{}
	_ CancelFixture    = CommandFixture{}
	_ UnstartedFixture = CommandFixture{}
)

func (c CommandFixture) run(ctx context.Context, words ...string) (string, error) {
	if len(c.Argv) == 0 {
		return "", fmt.Errorf("fixture command: no command given")
	}
	args := append(append([]string{}, c.Argv[1:]...), words...)
	cmd := exec.CommandContext(ctx, c.Argv[0], args...)
	cmd.Env = c.Env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("fixture command %q %s: %w: %s", c.name(), strings.Join(words, " "), err, strings.TrimSpace(errOut.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

func (c CommandFixture) yesNo(ctx context.Context, words ...string) (bool, error) {
	out, err := c.run(ctx, words...)
	switch {
	case err != nil:
		return false, err
	case out == "yes":
		return true, nil
	case out == "no":
		return false, nil
	}
	return false, fmt.Errorf("fixture command %q %s printed %q; want yes or no", c.name(), strings.Join(words, " "), out)
}

// Restart runs "restart".
func (c CommandFixture) Restart(ctx context.Context) error {
	_, err := c.run(ctx, "restart")
	return err
}

// Hold runs "hold N".
func (c CommandFixture) Hold(ctx context.Context, n int) error {
	_, err := c.run(ctx, "hold", strconv.Itoa(n))
	return err
}

// HoldCancelable runs "hold-cancelable N"; a command that prints
// "unsupported" gives an error wrapping errors.ErrUnsupported.
func (c CommandFixture) HoldCancelable(ctx context.Context, n int) error {
	out, err := c.run(ctx, "hold-cancelable", strconv.Itoa(n))
	if err == nil && out == "unsupported" {
		return fmt.Errorf("fixture command %q hold-cancelable: %w", c.Argv[0], errors.ErrUnsupported)
	}
	return err
}

// HoldUnstarted runs "hold-unstarted N"; a command that prints
// "unsupported" gives an error wrapping errors.ErrUnsupported.
func (c CommandFixture) HoldUnstarted(ctx context.Context, n int) error {
	out, err := c.run(ctx, "hold-unstarted", strconv.Itoa(n))
	if err == nil && out == "unsupported" {
		return fmt.Errorf("fixture command %q hold-unstarted: %w", c.name(), errors.ErrUnsupported)
	}
	return err
}

// Finish runs "finish".
func (c CommandFixture) Finish(ctx context.Context) error {
	_, err := c.run(ctx, "finish")
	return err
}

// Lead runs "lead LEASE".
func (c CommandFixture) Lead(ctx context.Context, lease string) (bool, error) {
	return c.yesNo(ctx, "lead", lease)
}

// Stopping runs "stopping LEASE".
func (c CommandFixture) Stopping(ctx context.Context, lease string) (bool, error) {
	return c.yesNo(ctx, "stopping", lease)
}

// Release runs "release LEASE".
func (c CommandFixture) Release(ctx context.Context, lease string) error {
	_, err := c.run(ctx, "release", lease)
	return err
}
