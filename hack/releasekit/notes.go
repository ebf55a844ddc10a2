package main

import (
	"fmt"
	"strings"

	"golang.org/x/mod/semver"
)

// section is one "## " section of a changelog.
type section struct {
	heading string // the heading line without "## "
	body    string
}

// sections splits a Markdown changelog at its "## " headings (a "## " in a
// fenced code block is not one); what comes before the first is dropped.
func sections(changelog string) []section {
	var out []section
	var cur *section
	var body strings.Builder
	fenced := false
	flush := func() {
		if cur != nil {
			cur.body = body.String()
			out = append(out, *cur)
		}
		body.Reset()
	}
	for line := range strings.Lines(changelog) {
		trimmed := strings.TrimRight(line, "\r\n")
		if strings.HasPrefix(strings.TrimSpace(trimmed), "```") {
			fenced = !fenced
		}
		if !fenced && strings.HasPrefix(trimmed, "## ") {
			flush()
			cur = &section{heading: strings.TrimSpace(strings.TrimPrefix(trimmed, "## "))}
			continue
		}
		body.WriteString(line)
	}
	flush()
	return out
}

// headingVersion is the version a section's heading starts with ("v0.2.0
// (2026-12-10)", "[v0.2.0] - 2026-12-10", "0.2.0": v0.2.0), or "".
func headingVersion(h string) string {
	w, _, _ := strings.Cut(h, " ")
	w = strings.TrimSuffix(strings.TrimPrefix(w, "["), "]")
	if !strings.HasPrefix(w, "v") {
		w = "v" + w
	}
	if semver.IsValid(w) && semver.Canonical(w) == w {
		return w
	}
	return ""
}

// releaseNotes returns the body of the changelog's section for version v,
// trimmed, with a final newline: the section whose heading starts with v;
// for a prerelease without one, its release's section (v0.3.0 for
// v0.3.0-rc.1), else the one whose heading starts with "Unreleased"
// (case-insensitive). A release (no prerelease) must have its own section:
// its notes are what users read before they upgrade.
func releaseNotes(changelog, v string) (string, error) {
	if err := releaseVersion(v); err != nil {
		return "", err
	}
	secs := sections(changelog)
	find := func(want string) *section {
		for i := range secs {
			if headingVersion(secs[i].heading) == want {
				return &secs[i]
			}
		}
		return nil
	}
	s := find(v)
	if s == nil && semver.Prerelease(v) != "" {
		if s = find(strings.TrimSuffix(v, semver.Prerelease(v))); s == nil {
			for i := range secs {
				if strings.HasPrefix(strings.ToLower(secs[i].heading), "unreleased") {
					s = &secs[i]
					break
				}
			}
		}
	}
	if s == nil {
		return "", fmt.Errorf("the changelog has no section for %s: before tagging, give its notes the heading \"## %s (YYYY-MM-DD)\" (a prerelease may use its release's section or \"## Unreleased\")", v, v)
	}
	body := strings.TrimSpace(s.body)
	if body == "" {
		return "", fmt.Errorf("the changelog's section %q for %s is empty", s.heading, v)
	}
	return body + "\n", nil
}
