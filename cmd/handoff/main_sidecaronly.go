//go:build sidecaronly

// Command handoff, built with the tag sidecaronly, is bin/handoff-sidecar:
// the commands the sidecar container, the install step and the preStop hook
// run, without the webhook, the injector or cobra (main.go is bin/handoff).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"

	"github.com/handoff-dev/handoff/version"
)

// commands are bin/handoff-sidecar's: what the sidecar and install
// containers and the preStop hook run, and version.
var commands = []command{sidecarCmd, prestopCmd, installCmd}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "handoff:", err)
		os.Exit(1)
	}
}

// run runs the command args name, as bin/handoff's cobra root would: the
// same flags, "--help" on each command, and the same errors for an unknown
// command or flag.
func run(args []string, out, errOut io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(out)
		return nil
	}
	if args[0] == "version" {
		return runVersion(args[1:], out)
	}
	for _, c := range commands {
		if c.name() != args[0] {
			continue
		}
		fs := pflag.NewFlagSet(c.name(), pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		run := c.setup(fs)
		if err := fs.Parse(args[1:]); err != nil {
			if errors.Is(err, pflag.ErrHelp) {
				fmt.Fprintf(out, "%s\n\nUsage:\n  handoff %s\n\nFlags:\n%s", c.long, c.use, fs.FlagUsages())
				return nil
			}
			return err
		}
		if err := c.checkArgs(fs.Args()); err != nil {
			return err
		}
		return run(invocation{ctx: context.Background(), args: fs.Args(), argsAtDash: fs.ArgsLenAtDash(), out: out, errOut: errOut})
	}
	return fmt.Errorf("unknown command %q for %q", args[0], "handoff")
}

func usage(w io.Writer) {
	fmt.Fprint(w, "Turns a queue worker's shutdown into a handover: drain, hand back claims, release the Lease\n\nUsage:\n  handoff [command]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name(), c.short)
	}
	fmt.Fprintf(w, "  %-10s %s\n\nRun \"handoff COMMAND --help\" for a command's flags.\n", "version", "Print the handoff version")
}

// runVersion is bin/handoff-sidecar's version command: the client's
// version as bin/handoff's `handoff version --client` prints it, with the
// same --output.
func runVersion(args []string, out io.Writer) error {
	fs := pflag.NewFlagSet("version", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Bool("client", true, "print the client's version only (this build has no other)")
	format := fs.StringP("output", "o", "", "json or yaml; text without it")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(out, "Print the handoff version\n\nUsage:\n  handoff version [flags]\n\nFlags:\n%s", fs.FlagUsages())
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unknown command %q for %q", fs.Arg(0), "handoff version")
	}
	return writeVersion(out, versionReport{Client: version.GetInfo()}, *format)
}

// runCommand runs c with args as bin/handoff-sidecar does (tests).
func runCommand(c command, args []string, out, errOut io.Writer) error {
	return run(append([]string{c.name()}, args...), out, errOut)
}

// checkArgs enforces maxArgs, in cobra's words.
func (c command) checkArgs(args []string) error {
	switch {
	case c.maxArgs < 0 || len(args) <= c.maxArgs:
		return nil
	case c.maxArgs == 0:
		return fmt.Errorf("unknown command %q for %q", args[0], "handoff "+c.name())
	default:
		return fmt.Errorf("accepts at most %d arg(s), received %d", c.maxArgs, len(args))
	}
}

// name is the command's name, the first word of use.
func (c command) name() string {
	for i, r := range c.use {
		if r == ' ' {
			return c.use[:i]
		}
	}
	return c.use
}
