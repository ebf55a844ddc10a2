package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	// A Markdown link or image's target: [text](target), no spaces.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// A fenced code block, whose text is not Markdown.
	fence = regexp.MustCompile("(?s)```.*?```")
	// An ATX heading's text.
	heading = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.*?)[ \t#]*$`)
	// What GitHub drops from a heading to make its anchor.
	notSlug = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
)

// anchors are the anchors GitHub gives the headings of a Markdown text:
// lower case, punctuation but - and _ dropped, spaces as -, and -1, -2, …
// after a repeated one.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
		a := strings.ReplaceAll(notSlug.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// Every relative link of the repository's Markdown names a file that
// exists, and a heading of it when it names an anchor: moving a section
// from one page to another cannot leave links pointing at nothing.
func TestRelativeLinksResolve(t *testing.T) {
	pages := docs(t)
	for path, text := range pages {
		for _, m := range mdLink.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
			target := m[1]
			if regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`).MatchString(target) {
				continue // a URL
			}
			file, anchor, _ := strings.Cut(target, "#")
			dst := path
			if file != "" {
				dst = filepath.Join(filepath.Dir(path), file)
				if _, err := os.Stat(dst); err != nil {
					t.Errorf("%s links to %s: no such file", path, target)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(dst, ".md") {
				continue
			}
			page, ok := pages[dst]
			if !ok {
				b, err := os.ReadFile(dst)
				if err != nil {
					t.Errorf("%s links to %s: %v", path, target, err)
					continue
				}
				page = string(b)
			}
			if !anchors(page)[anchor] {
				t.Errorf("%s links to %s: %s has no heading with that anchor", path, target, dst)
			}
		}
	}
}
