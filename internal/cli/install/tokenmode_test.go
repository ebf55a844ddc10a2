package install

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// install --token-mode sets who may read the token file: 0440 by default
// (its owner, the user install runs as, and its group: the injector makes
// them the worker's and the sidecar's), 0444 when the injector cannot tell
// the worker's user; a mode that lets anyone write it, or another, is an
// error.
func TestInstallTokenMode(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want os.FileMode
	}{
		{nil, 0o440},
		{[]string{"--token-mode", "0444"}, 0o444},
		{[]string{"--token-mode", "0400"}, 0o400},
	} {
		path := filepath.Join(t.TempDir(), "token")
		if err := runCommand(Command, append([]string{"--token-file", path}, tc.args...), io.Discard, io.Discard); err != nil {
			t.Fatalf("install %v: %v", tc.args, err)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != tc.want {
			t.Errorf("install %v: token file mode %v (%v), want %v", tc.args, fi.Mode().Perm(), err, tc.want)
		}
	}
	for _, bad := range []string{"0644", "0666", "644x", "0"} {
		path := filepath.Join(t.TempDir(), "token")
		err := runCommand(Command, []string{"--token-file", path, "--token-mode", bad}, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--token-mode") {
			t.Errorf("install --token-mode %s: %v; want an error naming --token-mode", bad, err)
		}
		if _, err := os.Stat(path); err == nil {
			t.Errorf("install --token-mode %s wrote the token anyway", bad)
		}
	}
}
