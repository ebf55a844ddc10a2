// Package quickstart reads the README's quickstart: the ```sh block on the
// lines after the HTML comment <!-- quickstart -->. The e2e suite runs it as
// written: its setup installs the platform's chart with the block's own
// `helm install handoff …` command (plus the e2e-only flags), and
// TestQuickstart runs the rest of the block with bash against the e2e
// cluster. This package only reads and splits the block; it runs nothing
// but bash's expansion of the install command's words.
package quickstart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Marker is the line that comes right before the quickstart's ```sh block.
const Marker = "<!-- quickstart -->"

// platformInstall starts the command that installs the platform's chart.
const platformInstall = "helm install handoff "

// Quickstart is the README's quickstart block, split where the e2e suite
// splits it.
type Quickstart struct {
	// Script is the whole block, as a user runs it (without the fences).
	Script string
	// Before is the block's lines before the platform's install: its
	// variable assignments and comments.
	Before string
	// PlatformInstall is the command that installs the platform's chart,
	// `helm install handoff …`, with its continuation lines (each ending
	// in a backslash) as the block writes them.
	PlatformInstall string
	// Rest is the script without PlatformInstall: Before, then every line
	// after the install. It runs on its own once the chart is installed.
	Rest string
}

// Read reads the README at path and parses its quickstart (see Parse).
func Read(path string) (Quickstart, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Quickstart{}, err
	}
	return Parse(string(b))
}

// Parse finds the quickstart in readme, a Markdown document: the ```sh
// block that starts on the line after Marker (blank lines between are
// allowed). It fails when there is no Marker, when no ```sh block follows
// it or the block is not closed, or when the block does not hold exactly
// one command that starts with `helm install handoff ` at the start of a
// line.
func Parse(readme string) (Quickstart, error) {
	lines := strings.Split(readme, "\n")
	start := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == Marker {
			start = i + 1
			break
		}
	}
	if start < 0 {
		return Quickstart{}, fmt.Errorf("no line %s", Marker)
	}
	for start < len(lines) && strings.TrimSpace(lines[start]) == "" {
		start++
	}
	if start >= len(lines) || strings.TrimSpace(lines[start]) != "```sh" {
		return Quickstart{}, fmt.Errorf("%s is not followed by a ```sh block", Marker)
	}
	end := -1
	for i := start + 1; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) == "```" {
			end = i
			break
		}
	}
	if end < 0 {
		return Quickstart{}, errors.New("the quickstart's ```sh block is not closed")
	}
	block := lines[start+1 : end]

	first, last := -1, -1
	for i, l := range block {
		if !strings.HasPrefix(l, platformInstall) {
			continue
		}
		if first >= 0 {
			return Quickstart{}, fmt.Errorf("the quickstart has two commands %q; want one", strings.TrimSpace(platformInstall))
		}
		first, last = i, i
		for last < len(block)-1 && strings.HasSuffix(block[last], `\`) {
			last++
		}
	}
	if first < 0 {
		return Quickstart{}, fmt.Errorf("the quickstart has no line starting %q: the platform's install", platformInstall)
	}
	join := func(ls []string) string {
		if len(ls) == 0 {
			return ""
		}
		return strings.Join(ls, "\n") + "\n"
	}
	q := Quickstart{
		Script:          join(block),
		Before:          join(block[:first]),
		PlatformInstall: join(block[first : last+1]),
	}
	q.Rest = q.Before + join(block[last+1:])
	return q, nil
}

// PlatformInstallArgs returns the words of PlatformInstall after `helm`
// (its first is "install"), as bash expands them once Before has run, with
// env (KEY=VALUE) added to this process's environment: so a variable the
// block defaults with ${VAR:-default} takes env's value. Nothing but Before
// and the expansion runs: the command is printed, not run.
func (q Quickstart) PlatformInstallArgs(ctx context.Context, env []string) ([]string, error) {
	line := "printf '%s\\0' " + strings.TrimPrefix(q.PlatformInstall, "helm ")
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", q.Before+line)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("bash, expanding the quickstart's %q: %w: %s", strings.TrimSpace(platformInstall), err, strings.TrimSpace(stderr.String()))
	}
	args := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if len(args) < 2 || args[0] != "install" || args[1] != "handoff" {
		return nil, fmt.Errorf("the quickstart's platform install expands to helm %q; want helm install handoff …", args)
	}
	return args, nil
}
