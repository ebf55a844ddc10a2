// Package prestop is the prestop command: the preStop hook that asks the
// pod's sidecar to run the handover and waits until it is over.
package prestop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/spf13/pflag"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/token"
	hook "github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

// Command is the prestop command.
var Command = command.Command{
	Use:   "prestop [-- COMMAND [ARG...]]",
	Short: "The preStop hook: run the handover in the sidecar and wait until it is over",
	Long: `prestop asks the pod's handoff sidecar, on its control socket (or a loopback
address the pod opted into), to run the shutdown sequence
(stop claiming, drain, hand back claims, release the Lease) and blocks until
it is over, then prints what happened. It exits non-zero when the sidecar
cannot be reached, so the kubelet records FailedPreStopHook.

A hook the container had before injection runs after the handover, whatever
its outcome: a COMMAND after "--" (an exec hook), or --then-sleep (a sleep
hook).`,
	MaxArgs: -1,
	Setup: func(fs *pflag.FlagSet) func(command.Invocation) error {
		var (
			addr           string
			timeout        time.Duration
			connectTimeout time.Duration
			thenSleep      time.Duration
			tokenFile      string
		)
		d, _ := config.Lookup("control-addr")
		fs.StringVar(&addr, "addr", d.Default, "address of the sidecar's control API: "+d.Form)
		fs.DurationVar(&timeout, "timeout", 10*time.Minute, "give up waiting after this long (the kubelet also ends the hook at the grace period)")
		fs.DurationVar(&connectTimeout, "connect-timeout", 5*time.Second, "keep retrying a refused connection for this long")
		fs.DurationVar(&thenSleep, "then-sleep", 0, "sleep this long after the handover (a wrapped sleep hook)")
		fs.StringVar(&tokenFile, "token-file", "", "file with the pod's token, which signs the call (default $"+protocol.TokenFileEnv+")")
		return func(inv command.Invocation) error {
			args := inv.Args
			if n := inv.ArgsAtDash; n != 0 && len(args) > 0 {
				return fmt.Errorf("unexpected argument %q: a command to run after the handover goes after --", args[0])
			}
			// A socket, or loopback only, as the sidecar listens.
			control, err := protocol.ParseEndpoint(addr)
			if err != nil {
				return fmt.Errorf("flag --addr: %w", err)
			}
			ctx, cancel := context.WithTimeout(inv.Ctx, timeout)
			defer cancel()
			var errs []error
			token, err := token.Read(tokenFile)
			var rep *protocol.Report
			if err == nil {
				rep, err = hook.Call(ctx, control, token, connectTimeout)
			}
			switch {
			case err != nil:
				errs = append(errs, err)
			case len(rep.Errors) > 0:
				printReport(inv.Out, rep)
				errs = append(errs, fmt.Errorf("handover finished with %d errors", len(rep.Errors)))
			default:
				printReport(inv.Out, rep)
			}
			errs = append(errs, then(ctx, inv, args, thenSleep))
			return errors.Join(errs...)
		}
	},
}

// then runs the container's own hook, kept by injection, after the handover.
func then(ctx context.Context, inv command.Invocation, args []string, sleep time.Duration) error {
	if len(args) > 0 {
		c := exec.CommandContext(ctx, args[0], args[1:]...)
		c.Stdout, c.Stderr = inv.Out, inv.ErrOut
		if err := c.Run(); err != nil {
			return fmt.Errorf("the container's own preStop command %q: %w", args[0], err)
		}
	}
	if sleep > 0 {
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
		}
	}
	return nil
}

func printReport(w io.Writer, rep *protocol.Report) {
	fmt.Fprintf(w, "handoff: %s by %s; deadline %s (from %s)\n", rep.Outcome, rep.Trigger,
		rep.Deadline.Sub(rep.Started).Round(time.Millisecond), rep.DeadlineSource)
	for _, s := range rep.Steps {
		fmt.Fprintf(w, "  +%-8s %-20s %s\n", s.At.Sub(rep.Started).Round(time.Millisecond), s.Name, s.Detail)
	}
	if rep.InFlightAtDeadline > 0 {
		fmt.Fprintf(w, "  in flight at deadline: %d, returned: %d\n", rep.InFlightAtDeadline, rep.Returned)
	}
	if rep.Abandoned > 0 {
		fmt.Fprintf(w, "  abandoned to the visibility timeout: %d\n", rep.Abandoned)
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(w, "  error: %s\n", e)
	}
}
