package cobracmd

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/handoff-dev/handoff/internal/cli/command"
)

// A command run through cobra and through the pflag runner gives the same
// output and the same errors.
func TestCobraRunsCommandsAsThePflagRunner(t *testing.T) {
	c := command.Command{Use: "echo [WORD]...", Short: "Print", Long: "echo prints.", MaxArgs: 1,
		Setup: func(fs *pflag.FlagSet) func(command.Invocation) error {
			upper := fs.Bool("upper", false, "in capitals")
			return func(inv command.Invocation) error {
				s := strings.Join(inv.Args, " ") + "\n"
				if *upper {
					s = strings.ToUpper(s)
				}
				_, err := inv.Out.Write([]byte(s))
				return err
			}
		}}
	none := command.Command{Use: "none", Setup: func(*pflag.FlagSet) func(command.Invocation) error {
		return func(command.Invocation) error { return nil }
	}}
	r := command.Root{Short: "root", Commands: []command.Command{c, none}}
	for _, args := range [][]string{{"echo", "--upper", "a"}, {"echo", "a", "b"}, {"echo", "--bogus"}, {"none", "x"}} {
		var viaCobra, viaPflag strings.Builder
		root := Root(r)
		root.SetArgs(args)
		root.SetOut(&viaCobra)
		root.SetErr(&viaCobra)
		cerr := root.ExecuteContext(context.Background())
		perr := r.Run(context.Background(), args, nil, &viaPflag, &viaPflag)
		if viaCobra.String() != viaPflag.String() || (cerr == nil) != (perr == nil) || (cerr != nil && cerr.Error() != perr.Error()) {
			t.Errorf("handoff %s: cobra %q, %v; pflag %q, %v", strings.Join(args, " "), viaCobra.String(), cerr, viaPflag.String(), perr)
		}
	}
}
