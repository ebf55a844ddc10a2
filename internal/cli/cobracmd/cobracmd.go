// Package cobracmd runs handoff's commands (package command) as cobra
// commands: bin/handoff's root (cmd/handoff) alone uses it, so that
// bin/handoff-sidecar links no cobra.
package cobracmd

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/handoff-dev/handoff/internal/cli/command"
)

// New is c as a cobra command: its Use, help, argument count and flags.
func New(c command.Command) *cobra.Command {
	cmd := &cobra.Command{Use: c.Use, Short: c.Short, Long: c.Long, SilenceUsage: true, SilenceErrors: true}
	switch {
	case c.MaxArgs == 0:
		cmd.Args = cobra.NoArgs
	case c.MaxArgs > 0:
		cmd.Args = cobra.MaximumNArgs(c.MaxArgs)
	}
	run := c.Setup(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return run(command.Invocation{Ctx: cmd.Context(), Args: args, ArgsAtDash: cmd.ArgsLenAtDash(),
			In: cmd.InOrStdin(), Out: cmd.OutOrStdout(), ErrOut: cmd.ErrOrStderr()})
	}
	return cmd
}

// Root is r as a cobra root command "handoff" with each of r's commands.
func Root(r command.Root) *cobra.Command {
	root := &cobra.Command{Use: "handoff", Short: r.Short, SilenceUsage: true, SilenceErrors: true}
	for _, c := range r.Commands {
		root.AddCommand(New(c))
	}
	return root
}

// Main runs r's command that os.Args names through cobra, and exits 1,
// after printing "handoff: ERROR" on standard error, when it fails.
func Main(r command.Root) {
	if err := Root(r).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "handoff:", err)
		os.Exit(1)
	}
}
