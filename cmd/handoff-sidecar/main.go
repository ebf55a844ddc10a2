// Command handoff-sidecar is bin/handoff-sidecar, what injected pods run:
// the commands of the sidecar container, the install step and the preStop
// hook, and the client's version, run with pflag alone. It links no cobra,
// no controller-runtime, no webhook or injector, no zap (footprint_test.go):
// their code and init-time data would cost the idle sidecar megabytes of
// resident memory (docs/performance.md, Footprint). bin/handoff
// (cmd/handoff) has these commands and every other.
package main

import (
	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/install"
	"github.com/handoff-dev/handoff/internal/cli/prestop"
	"github.com/handoff-dev/handoff/internal/cli/sidecar"
	"github.com/handoff-dev/handoff/internal/cli/version/client"
)

// root is bin/handoff-sidecar's command set, in its usage's order.
var root = command.Root{
	Short:    "Turns a queue worker's shutdown into a handover: drain, hand back claims, release the Lease",
	Commands: []command.Command{sidecar.Command, prestop.Command, install.Command, client.Command},
}

func main() { root.Main() }
