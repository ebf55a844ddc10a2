package main

import (
	"context"
	"io"

	"github.com/spf13/pflag"
)

// command is one of the commands both builds have (sidecar, prestop,
// install), written without a CLI library: bin/handoff runs them as cobra
// commands (cobra.go), bin/handoff-sidecar with pflag alone
// (main_sidecaronly.go), since cobra and the text/template it runs cost the
// idle sidecar about 1 MiB of resident memory (docs/performance.md,
// Footprint). Flags are pflag's in both, so they parse alike.
type command struct {
	use   string // the name, then the arguments' synopsis (cobra's Use)
	short string // one line for the command list
	long  string // the help text
	// maxArgs is the number of arguments allowed, -1 for any.
	maxArgs int
	// setup registers the command's flags on fs and returns what runs
	// once they are parsed.
	setup func(fs *pflag.FlagSet) func(inv invocation) error
}

// invocation is one run of a command: its context, its arguments (flags
// removed), where "--" was, and its output streams.
type invocation struct {
	ctx  context.Context
	args []string
	// argsAtDash is how many of args came before "--", or -1 without "--"
	// (pflag's and cobra's ArgsLenAtDash).
	argsAtDash  int
	out, errOut io.Writer
}
