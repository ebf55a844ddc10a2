package protocol_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/protocol"
)

const token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestReadTokenFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		content, want, err string
	}{
		{token + "\n", token, ""},
		{"  " + token + "\r\n", token, ""},
		{"", "", "0 bytes"},
		{"short\n", "", "want at least 32"},
		{strings.Repeat("a", 20) + " " + strings.Repeat("b", 20), "", "not printable ASCII"},
		{strings.Repeat("é", 20), "", "not printable ASCII"},
	} {
		path := filepath.Join(dir, "token")
		if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := protocol.ReadTokenFile(path)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && (!strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), path))) {
			t.Errorf("file %q: %q, %v; want %q and an error saying %q and naming the file", tc.content, got, err, tc.want, tc.err)
		}
	}
	if _, err := protocol.ReadTokenFile(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing file: %v; want an error naming it", err)
	}
}
