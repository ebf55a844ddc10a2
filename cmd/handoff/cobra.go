//go:build !sidecaronly

package main

import (
	"io"

	"github.com/spf13/cobra"
)

// cobra is c as a cobra command, for bin/handoff (main.go).
func (c command) cobra() *cobra.Command {
	cmd := &cobra.Command{Use: c.use, Short: c.short, Long: c.long}
	switch {
	case c.maxArgs == 0:
		cmd.Args = cobra.NoArgs
	case c.maxArgs > 0:
		cmd.Args = cobra.MaximumNArgs(c.maxArgs)
	}
	run := c.setup(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return run(invocation{ctx: cmd.Context(), args: args, argsAtDash: cmd.ArgsLenAtDash(), out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr()})
	}
	return cmd
}

func sidecarCommand() *cobra.Command { return sidecarCmd.cobra() }
func prestopCommand() *cobra.Command { return prestopCmd.cobra() }
func installCommand() *cobra.Command { return installCmd.cobra() }

// runCommand runs c with args as bin/handoff does, through cobra (tests).
func runCommand(c command, args []string, out, errOut io.Writer) error {
	cmd := c.cobra()
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	return cmd.Execute()
}
