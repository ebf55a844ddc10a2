// Command handoff is the handoff CLI and webhook: a graceful-shutdown
// coordinator for Kubernetes queue workers that hold claimed messages and an
// exclusive Lease. It has every command: the webhook and its tools (inject,
// conformance, status, check, version), and the sidecar's (sidecar,
// prestop, install), so one binary still does everything.
// bin/handoff-sidecar (cmd/handoff-sidecar) has the sidecar's alone.
// Each command is a package of internal/cli, run here through cobra.
package main

import (
	"github.com/handoff-dev/handoff/internal/cli/check"
	"github.com/handoff-dev/handoff/internal/cli/cobracmd"
	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/conformance"
	"github.com/handoff-dev/handoff/internal/cli/inject"
	"github.com/handoff-dev/handoff/internal/cli/install"
	"github.com/handoff-dev/handoff/internal/cli/prestop"
	"github.com/handoff-dev/handoff/internal/cli/sidecar"
	"github.com/handoff-dev/handoff/internal/cli/status"
	"github.com/handoff-dev/handoff/internal/cli/version"
	"github.com/handoff-dev/handoff/internal/cli/webhook"
)

// root is bin/handoff's command set.
var root = command.Root{
	Short: "Turns a queue worker's shutdown into a handover: drain, hand back claims, release the Lease",
	Commands: []command.Command{sidecar.Command, prestop.Command, install.Command, version.Command,
		inject.Command, webhook.Command, conformance.Command, status.Command, check.Command},
}

func main() { cobracmd.Main(root) }
