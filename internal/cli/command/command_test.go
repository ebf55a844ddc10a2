package command

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// echo is a command with one flag that prints its arguments.
func echo(maxArgs int) Command {
	return Command{Use: "echo [WORD]...", Short: "Print the words", Long: "echo prints its words.", MaxArgs: maxArgs,
		Setup: func(fs *pflag.FlagSet) func(Invocation) error {
			upper := fs.Bool("upper", false, "in capitals")
			return func(inv Invocation) error {
				s := strings.Join(inv.Args, " ")
				if *upper {
					s = strings.ToUpper(s)
				}
				_, err := inv.Out.Write([]byte(s + "\n"))
				return err
			}
		}}
}

// Root.Run: the command by name, its flags, --help, and cobra's words for
// a wrong command, argument count or flag.
func TestRun(t *testing.T) {
	root := Root{Short: "Test root", Commands: []Command{echo(2), {Use: "none", Short: "Takes none", MaxArgs: 0,
		Setup: func(*pflag.FlagSet) func(Invocation) error { return func(Invocation) error { return nil } }}}}
	for _, tc := range []struct {
		args      []string
		out, fail string
	}{
		{[]string{"echo", "--upper", "a", "b"}, "A B\n", ""},
		{nil, "Test root\n\nUsage:\n  handoff [command]\n\nCommands:\n  echo       Print the words\n  none       Takes none\n\nRun \"handoff COMMAND --help\" for a command's flags.\n", ""},
		{[]string{"echo", "--help"}, "echo prints its words.\n\nUsage:\n  handoff echo [WORD]...\n\nFlags:\n      --upper   in capitals\n", ""},
		{[]string{"echo", "a", "b", "c"}, "", "accepts at most 2 arg(s), received 3"},
		{[]string{"none", "x"}, "", `unknown command "x" for "handoff none"`},
		{[]string{"echo", "--bogus"}, "", "unknown flag: --bogus"},
		{[]string{"nope"}, "", `unknown command "nope" for "handoff"`},
	} {
		var out strings.Builder
		err := root.Run(context.Background(), tc.args, nil, &out, &out)
		if tc.fail != "" {
			if err == nil || err.Error() != tc.fail {
				t.Errorf("handoff %s: %v, want %q", strings.Join(tc.args, " "), err, tc.fail)
			}
			continue
		}
		if err != nil || out.String() != tc.out {
			t.Errorf("handoff %s: %v\n%q\nwant\n%q", strings.Join(tc.args, " "), err, out.String(), tc.out)
		}
	}
}

func TestName(t *testing.T) {
	for use, want := range map[string]string{"install [DEST] [--token-file FILE]": "install", "status": "status"} {
		if got := (Command{Use: use}).Name(); got != want {
			t.Errorf("Name of %q = %q, want %q", use, got, want)
		}
	}
}
