package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/spf13/pflag"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

var prestopCmd = command{
	use:   "prestop [-- COMMAND [ARG...]]",
	short: "The preStop hook: run the handover in the sidecar and wait until it is over",
	long: `prestop asks the pod's handoff sidecar, on its control socket (or a loopback
address the pod opted into), to run the shutdown sequence
(stop claiming, drain, hand back claims, release the Lease) and blocks until
it is over, then prints what happened. It exits non-zero when the sidecar
cannot be reached, so the kubelet records FailedPreStopHook.

A hook the container had before injection runs after the handover, whatever
its outcome: a COMMAND after "--" (an exec hook), or --then-sleep (a sleep
hook).`,
	maxArgs: -1,
	setup: func(fs *pflag.FlagSet) func(invocation) error {
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
		return func(inv invocation) error {
			args := inv.args
			if n := inv.argsAtDash; n != 0 && len(args) > 0 {
				return fmt.Errorf("unexpected argument %q: a command to run after the handover goes after --", args[0])
			}
			// A socket, or loopback only, as the sidecar listens.
			control, err := protocol.ParseEndpoint(addr)
			if err != nil {
				return fmt.Errorf("flag --addr: %w", err)
			}
			ctx, cancel := context.WithTimeout(inv.ctx, timeout)
			defer cancel()
			var errs []error
			token, err := hookToken(tokenFile)
			var rep *protocol.Report
			if err == nil {
				rep, err = prestop.Call(ctx, control, token, connectTimeout)
			}
			switch {
			case err != nil:
				errs = append(errs, err)
			case len(rep.Errors) > 0:
				printReport(inv.out, rep)
				errs = append(errs, fmt.Errorf("handover finished with %d errors", len(rep.Errors)))
			default:
				printReport(inv.out, rep)
			}
			errs = append(errs, then(ctx, inv, args, thenSleep))
			return errors.Join(errs...)
		}
	},
}

// hookToken reads the pod's token from file, or from the file named by
// HANDOFF_TOKEN_FILE when file is "".
func hookToken(file string) (string, error) {
	if file == "" {
		file = os.Getenv(protocol.TokenFileEnv)
	}
	if file == "" {
		return "", fmt.Errorf("no token file: the sidecar needs the pod's token; give --token-file (injected pods use %s) or set %s", protocol.TokenFile, protocol.TokenFileEnv)
	}
	return protocol.ReadTokenFile(file)
}

// then runs the container's own hook, kept by injection, after the handover.
func then(ctx context.Context, inv invocation, args []string, sleep time.Duration) error {
	if len(args) > 0 {
		c := exec.CommandContext(ctx, args[0], args[1:]...)
		c.Stdout, c.Stderr = inv.out, inv.errOut
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
