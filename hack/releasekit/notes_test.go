package main

import (
	"os"
	"strings"
	"testing"
)

const changelog = "# Changelog\n\nIntro.\n\n" +
	"## Unreleased\n\n- next thing\n\n" +
	"## v0.3.0-rc.1 (2026-12-20)\n\n- candidate notes\n\n" +
	"## [v0.2.0] - 2026-12-10\n\n### Operators\n- two\n\n```sh\n## not a heading\n```\n\n" +
	"## 0.1.0\n\n- one\n\n" +
	"## v0.0.9\n\n"

func TestReleaseNotes(t *testing.T) {
	for v, want := range map[string]string{
		"v0.2.0":                "### Operators\n- two\n\n```sh\n## not a heading\n```\n",
		"v0.1.0":                "- one\n",
		"v0.3.0-rc.1":           "- candidate notes\n",
		"v0.2.0-rc.2":           "### Operators\n- two\n\n```sh\n## not a heading\n```\n", // its release's section
		"v0.4.0-rc.1":           "- next thing\n",                                         // no section: Unreleased
		"v0.0.0-dev.3.gabc1234": "- next thing\n",
		"v0.2.1-dev.1.gabc1234": "- next thing\n",
	} {
		got, err := releaseNotes(changelog, v)
		if err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", v, got, err, want)
		}
	}
}

func TestReleaseNotesRefuses(t *testing.T) {
	for v, want := range map[string]string{
		"v0.4.0": `no section for v0.4.0: before tagging, give its notes the heading "## v0.4.0 (YYYY-MM-DD)"`,
		"v0.0.9": "empty",
		"0.2.0":  "leading v",
	} {
		if _, err := releaseNotes(changelog, v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one saying %q", v, err, want)
		}
	}
}

// TestTheChangelogHasNotesForASnapshot: the repository's CHANGELOG gives
// a build between tags its notes (hack/release.sh notes runs first in
// make release).
func TestTheChangelogHasNotesForASnapshot(t *testing.T) {
	data, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := releaseNotes(string(data), "v0.0.0-dev.1.gabc1234"); err != nil || len(n) < 100 {
		t.Errorf("CHANGELOG.md's notes for a snapshot: %v, %d bytes", err, len(n))
	}
}
