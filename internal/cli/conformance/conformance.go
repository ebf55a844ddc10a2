// Package conformance is the conformance command: it checks an app's side
// of the handoff protocol, case by case (package conformance of the
// module).
package conformance

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/conformance"
	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/token"
	"github.com/handoff-dev/handoff/protocol"
)

// Command is the conformance command: it checks an app's side of the
// protocol (package conformance).
var Command = command.Command{
	Use:   "conformance",
	Short: "Check a worker's side of the handoff protocol, case by case",
	Long: `conformance drives the app API a worker serves (the calls the sidecar
makes: stop-claiming, drain, return, leadership) through the protocol's cases
and prints each with pass, fail or skip and a reason. It exits non-zero when
any case fails. Point it at an idle worker that is not stopping and has no
sidecar: the suite stops its claiming.

The cases that need claims in flight run with --fixture-cmd, those that need
leader work with --leader-cmd; without, they are skipped. Each is a shell
command run as sh -c 'CMD "$@"' sh STEP ARGS, with no standard input:
  --fixture-cmd:  restart | hold N | hold-cancelable N | hold-unstarted N | finish
  --leader-cmd:   lead LEASE | stopping LEASE | release LEASE
A step exits 0 once done (hold: the claims counted in inFlight; release: the
leader work ended), non-zero to fail; lead and stopping print yes or no
(stopping: no when no leader work began), hold-cancelable and hold-unstarted
may print unsupported. docs/protocol.md, "The fixture contract".

-o text (the default) prints a line a case and a summary; -o json one JSON
object ({"cases": [{"name", "result", "reason", "seconds"}], "passed",
"failed", "skipped"}); -o junit JUnit XML, for a CI's test report. The exit
status is the same for each.

--list prints the cases without running any: a line a case with its id, its
group (the set-up it runs in) and the rule it checks, quoted from
docs/protocol.md with its anchor; -o json as {"cases": [{"id", "group",
"rule", "anchor"}]}.`,
	Setup: func(f *pflag.FlagSet) func(command.Invocation) error {
		var (
			appURL, tokenFile     string
			fixtureCmd, leaderCmd string
			leaseDuration         time.Duration
			timeout               time.Duration
			output                string
			list                  bool
		)
		d, _ := config.Lookup("app-url")
		f.StringVar(&appURL, "app-url", cmp.Or(os.Getenv(protocol.AppURLEnv), d.Default), "address of the app's side of the handoff protocol (default $"+protocol.AppURLEnv+", else the injected pod's): "+d.Form)
		f.StringVar(&tokenFile, "token-file", "", "file with the pod's token the app checks (default $"+protocol.TokenFileEnv+")")
		f.StringVar(&fixtureCmd, "fixture-cmd", "", "shell command that makes the app hold claims: run with restart, hold N, hold-cancelable N, hold-unstarted N or finish appended")
		f.StringVar(&leaderCmd, "leader-cmd", "", "shell command that makes the app begin leader work: run with lead, stopping or release and the Lease appended")
		f.DurationVar(&leaseDuration, "lease-duration", 0, "the lease duration the app bounds grants by (default $"+protocol.LeaseDurationEnv+", else 1h)")
		f.StringVarP(&output, "output", "o", "text", "text, json or junit (JUnit XML)")
		f.DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long; the cases not run are reported skip")
		f.BoolVar(&list, "list", false, "print the cases (id, group, rule and its anchor in docs/protocol.md) and run none; -o text or json")
		return func(inv command.Invocation) error {
			if list {
				switch output {
				case "text":
					return conformance.WriteCatalog(inv.Out)
				case "json":
					return conformance.WriteCatalogJSON(inv.Out)
				default:
					return fmt.Errorf("--output %q with --list: want text or json", output)
				}
			}
			_, err := protocol.ParseEndpoint(appURL)
			if err != nil {
				return fmt.Errorf("--app-url: %w", err)
			}
			if output != "text" && output != "json" && output != "junit" {
				return fmt.Errorf("--output %q: want text, json or junit", output)
			}
			if leaseDuration < 0 || leaseDuration > protocol.MaxLeaseDuration {
				return fmt.Errorf("--lease-duration %s: want the app's lease duration, above 0 and at most %s, or 0 for $%s or else %s",
					leaseDuration, protocol.MaxLeaseDuration, protocol.LeaseDurationEnv, protocol.MaxLeaseDuration)
			}
			if leaseDuration == 0 {
				if v := os.Getenv(protocol.LeaseDurationEnv); v != "" {
					if leaseDuration, err = time.ParseDuration(v); err != nil || leaseDuration <= 0 || leaseDuration > protocol.MaxLeaseDuration {
						return fmt.Errorf("$%s %q: want a duration above 0 and at most %s, like 15s", protocol.LeaseDurationEnv, v, protocol.MaxLeaseDuration)
					}
				}
			}
			tok, err := token.Read(tokenFile)
			if err != nil {
				return err
			}
			t := conformance.Target{URL: appURL, Token: tok, LeaseDuration: leaseDuration}
			shell := func(c string) conformance.CommandFixture {
				return conformance.CommandFixture{Argv: []string{"sh", "-c", c + ` "$@"`, "sh"}, Name: c}
			}
			if fixtureCmd != "" {
				t.Fixture = shell(fixtureCmd)
			}
			if leaderCmd != "" {
				t.Leader = shell(leaderCmd)
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s: want a duration above 0, like 10m", timeout)
			}
			ctx, cancel := context.WithTimeout(inv.Ctx, timeout)
			defer cancel()
			rep := conformance.Run(ctx, t)
			switch output {
			case "json":
				err = rep.WriteJSON(inv.Out)
			case "junit":
				err = rep.WriteJUnit(inv.Out, "handoff conformance "+appURL)
			default:
				_, err = fmt.Fprint(inv.Out, rep.String())
			}
			if err != nil {
				return err
			}
			if rep.Failed() {
				return fmt.Errorf("the app does not conform: %d of %d cases failed", rep.Count(conformance.Fail), len(rep.Cases))
			}
			return nil
		}
	},
}
