// Package command is the one shape every handoff command is written in,
// without a CLI library: a Command is its name, help, argument count and
// flags (pflag's), and what runs once they are parsed. bin/handoff-sidecar
// runs its commands with pflag alone (Main, in this package, which imports
// no cobra); bin/handoff runs every command as a cobra command
// (internal/cli/cobracmd), since cobra and the text/template it runs cost
// the idle sidecar about 1 MiB of resident memory (docs/performance.md,
// Footprint). Flags are pflag's in both, so they parse alike, and the
// errors for a wrong command, argument or flag are cobra's words in both.
package command

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

// Command is one command of a handoff binary.
type Command struct {
	// Use is the name, then the arguments' synopsis (cobra's Use), like
	// "install [DEST] [--token-file FILE]".
	Use string
	// Short is one line for the command list; Long the help text.
	Short, Long string
	// MaxArgs is the number of arguments allowed, -1 for any.
	MaxArgs int
	// Setup registers the command's flags on fs and returns what runs
	// once they are parsed.
	Setup func(fs *pflag.FlagSet) func(inv Invocation) error
}

// Invocation is one run of a command: its context, its arguments (flags
// removed), where "--" was, and its streams.
type Invocation struct {
	Ctx  context.Context
	Args []string
	// ArgsAtDash is how many of Args came before "--", or -1 without "--"
	// (pflag's and cobra's ArgsLenAtDash).
	ArgsAtDash  int
	In          io.Reader
	Out, ErrOut io.Writer
}

// Name is the command's name, the first word of Use.
func (c Command) Name() string {
	for i, r := range c.Use {
		if r == ' ' {
			return c.Use[:i]
		}
	}
	return c.Use
}

// CheckArgs enforces MaxArgs, in cobra's words: for a command that takes
// none, `unknown command "x" for "handoff NAME"`; else "accepts at most N
// arg(s), received M".
func (c Command) CheckArgs(args []string) error {
	switch {
	case c.MaxArgs < 0 || len(args) <= c.MaxArgs:
		return nil
	case c.MaxArgs == 0:
		return fmt.Errorf("unknown command %q for %q", args[0], "handoff "+c.Name())
	default:
		return fmt.Errorf("accepts at most %d arg(s), received %d", c.MaxArgs, len(args))
	}
}
