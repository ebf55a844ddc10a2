package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/protocol"
)

// tokenFile writes a token file as the install step does and returns its
// path.
func tokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if _, err := writeToken(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// install --token-file writes 256 random bits in hex, readable by the
// worker's user, and keeps a token already there (a rerun of the init
// step keeps the pod's token); a file with no token in it is replaced.
func TestInstallWritesTheTokenOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	run := func() string {
		cmd := installCommand()
		var out strings.Builder
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"--token-file", path})
		if err := cmd.Execute(); err != nil {
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
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("token file mode %v (%v): want 0644", fi.Mode(), err)
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
	cmd := installCommand()
	cmd.SetArgs(nil)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Errorf("install with nothing to do: %v; want an error naming DEST and --token-file", err)
	}
}

// The sidecar does not start without the pod's token.
func TestSidecarRefusesToStartWithoutAToken(t *testing.T) {
	for _, tc := range []struct {
		file, want string
	}{
		{"", "token-file: required"},
		{filepath.Join(t.TempDir(), "missing"), "no such file"},
	} {
		cmd := sidecarCommand()
		cmd.SetArgs([]string{"--token-file=" + tc.file})
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		t.Setenv(protocol.TokenFileEnv, "")
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("sidecar --token-file=%q: %v; want an error saying %q", tc.file, err, tc.want)
		}
	}
}
