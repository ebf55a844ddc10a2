//go:build sidecaronly

package main

import "github.com/spf13/cobra"

// toolCommands is empty in bin/handoff-sidecar: the sidecar container's
// binary links only sidecar, prestop, install and version (commands.go).
func toolCommands() []*cobra.Command { return nil }
