//go:build !sidecaronly

package main

import "github.com/spf13/cobra"

// toolCommands are the commands of bin/handoff that the sidecar container
// never runs: the webhook (controller-runtime, cert-controller), the
// injector and the conformance check of a worker. The build tag sidecaronly
// leaves them out (bin/handoff-sidecar, commands_sidecaronly.go): their
// packages' code and init-time data are most of the difference between the
// sidecar's memory and client-go's (docs/performance.md, Footprint).
func toolCommands() []*cobra.Command {
	return []*cobra.Command{injectCommand(), webhookCommand(), conformanceCommand(), statusCommand(), checkCommand()}
}
