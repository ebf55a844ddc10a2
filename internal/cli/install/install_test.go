package install

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/protocol"
)

func runCommand(c command.Command, args []string, out, errOut io.Writer) error {
	return command.Execute(context.Background(), c, args, nil, out, errOut)
}

// install --token-file writes 256 random bits in hex, readable by the
// worker's user, and keeps a token already there (a rerun of the init
// step keeps the pod's token); a file with no token in it is replaced.
func TestInstallWritesTheTokenOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	run := func() string {
		var out strings.Builder
		if err := runCommand(Command, []string{"--token-file", path}, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		tok, err := protocol.ReadTokenFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	first := run()
	if len(first) != 64 || strings.Trim(first, "0123456789abcdef") != "" {
		t.Errorf("token %q: want 64 hex digits", first)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o440 {
		t.Errorf("token file mode %v (%v): want 0440", fi.Mode(), err)
	}
	if again := run(); again != first {
		t.Errorf("a second install changed the token from %q to %q; want it kept", first, again)
	}
	if err := os.WriteFile(path, []byte("\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fresh := run(); fresh == first || len(fresh) != 64 {
		t.Errorf("install over an empty file: token %q; want a new one", fresh)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("%d files left in the directory; want only the token", len(entries))
	}
	if err := runCommand(Command, nil, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Errorf("install with nothing to do: %v; want an error naming DEST and --token-file", err)
	}
}

func TestInstallCopiesThisBinary(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "handoff")
	if err := runCommand(Command, []string{dst}, &bytes.Buffer{}, io.Discard); err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	a, err1 := os.Stat(self)
	b, err2 := os.Stat(dst)
	if err1 != nil || err2 != nil || a.Size() != b.Size() || b.Mode().Perm() != 0o755 {
		t.Errorf("installed %v (%v), want a 0755 copy of %s (%v)", b, err2, self, err1)
	}
}
