package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"
)

// Root is a binary's command set: the text its usage starts with, and its
// commands in the order its usage lists them.
type Root struct {
	Short    string
	Commands []Command
}

// Main runs the command os.Args names and exits 1, after printing
// "handoff: ERROR" on standard error, when it fails.
func (r Root) Main() {
	if err := r.Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "handoff:", err)
		os.Exit(1)
	}
}

// Run runs the command args[0] names with the rest of args, as bin/handoff's
// cobra root would: the same flags, "--help" on each command, and the same
// errors for an unknown command or flag. No arguments, "help", "-h" or
// "--help" print the usage.
func (r Root) Run(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		r.usage(out)
		return nil
	}
	for _, c := range r.Commands {
		if c.Name() == args[0] {
			return Execute(ctx, c, args[1:], in, out, errOut)
		}
	}
	return fmt.Errorf("unknown command %q for %q", args[0], "handoff")
}

// Execute runs c with args (its flags and arguments), with pflag alone:
// "--help" prints its help on out; a wrong flag or argument count is an
// error in cobra's words.
func Execute(ctx context.Context, c Command, args []string, in io.Reader, out, errOut io.Writer) error {
	fs := pflag.NewFlagSet(c.Name(), pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	run := c.Setup(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(out, "%s\n\nUsage:\n  handoff %s\n\nFlags:\n%s", c.Long, c.Use, fs.FlagUsages())
			return nil
		}
		return err
	}
	if err := c.CheckArgs(fs.Args()); err != nil {
		return err
	}
	return run(Invocation{Ctx: ctx, Args: fs.Args(), ArgsAtDash: fs.ArgsLenAtDash(), In: in, Out: out, ErrOut: errOut})
}

func (r Root) usage(w io.Writer) {
	fmt.Fprintf(w, "%s\n\nUsage:\n  handoff [command]\n\nCommands:\n", r.Short)
	for _, c := range r.Commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.Name(), c.Short)
	}
	fmt.Fprint(w, "\nRun \"handoff COMMAND --help\" for a command's flags.\n")
}
