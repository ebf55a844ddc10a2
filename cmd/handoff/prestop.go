package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

func prestopCommand() *cobra.Command {
	var (
		addr           string
		timeout        time.Duration
		connectTimeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "prestop",
		Short: "The preStop hook: run the handover in the sidecar and wait until it is over",
		Long: `prestop asks the handoff sidecar on loopback to run the shutdown sequence
(stop claiming, drain, hand back claims, release the Lease) and blocks until
it is over, then prints what happened. It exits non-zero when the sidecar
cannot be reached, so the kubelet records FailedPreStopHook.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rep, err := prestop.Call(ctx, addr, connectTimeout)
			if err != nil {
				return err
			}
			printReport(cmd.OutOrStdout(), rep)
			if len(rep.Errors) > 0 {
				return fmt.Errorf("handover finished with %d errors", len(rep.Errors))
			}
			return nil
		},
	}
	d, _ := config.Lookup("control-addr")
	cmd.Flags().StringVar(&addr, "addr", d.Default, "address of the sidecar's control API")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up waiting after this long (the kubelet also ends the hook at the grace period)")
	cmd.Flags().DurationVar(&connectTimeout, "connect-timeout", 5*time.Second, "keep retrying a refused connection for this long")
	return cmd
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
	for _, e := range rep.Errors {
		fmt.Fprintf(w, "  error: %s\n", e)
	}
}
