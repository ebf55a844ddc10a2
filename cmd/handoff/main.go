//go:build !sidecaronly

// Command handoff is the handoff sidecar and its tools: a graceful-shutdown
// coordinator for Kubernetes queue workers that hold claimed messages and an
// exclusive Lease. Built with the tag sidecaronly (bin/handoff-sidecar) it
// has only the commands the sidecar container, the install step and the
// preStop hook run, without cobra (main_sidecaronly.go).
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "handoff",
		Short:         "Turns a queue worker's shutdown into a handover: drain, hand back claims, release the Lease",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(sidecarCommand(), prestopCommand(), installCommand(), versionCommand())
	root.AddCommand(toolCommands()...)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "handoff:", err)
		os.Exit(1)
	}
}
