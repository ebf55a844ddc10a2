package check

import (
	"os"
	"strings"
	"testing"
)

// Every check's hint URL is a heading of docs/checks.md.
func TestCheckHintsAreDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/checks.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range healthChecks {
		if seen[c.ID] {
			t.Errorf("check ID %s is used twice", c.ID)
		}
		seen[c.ID] = true
		if !strings.Contains(string(doc), "\n## "+c.ID+"\n") {
			t.Errorf("docs/checks.md has no heading %q (the check's hint %s)", "## "+c.ID, checkHintBase+c.ID)
		}
	}
}
