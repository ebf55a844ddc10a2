package conformance

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// Every case has a unique ID of the form "area/what", belongs to a group
// that runs, and the table lists the groups in the order they run, so
// that reading it is reading the order of a run.
func TestCaseTableIDsAreUniqueAndGroupsRunInTableOrder(t *testing.T) {
	seen := map[string]bool{}
	for _, e := range table {
		if seen[e.id] {
			t.Errorf("case %q is listed twice", e.id)
		}
		seen[e.id] = true
		if area, what, ok := strings.Cut(e.id, "/"); !ok || area == "" || what == "" || strings.ContainsAny(e.id, " \t") {
			t.Errorf("case %q: want an ID of the form area/what, without spaces", e.id)
		}
		if !slices.ContainsFunc(groups, func(g group) bool { return g.name == e.group }) {
			t.Errorf("case %q: group %q is not one of groups: it would never run", e.id, e.group)
		}
		if e.run == nil {
			t.Errorf("case %q has no run function", e.id)
		}
	}
	if got, want := ids(ordered()), ids(table); !slices.Equal(got, want) {
		t.Errorf("the order of a run %v differs from the table's %v: list each group's cases together, groups in the order of groups", got, want)
	}
	if got := Cases(); !slices.Equal(got, ids(table)) {
		t.Errorf("Cases() = %v, want the table's IDs %v", got, ids(table))
	}
	cat := Catalog()
	if len(cat) != len(table) {
		t.Fatalf("Catalog() has %d cases, the table %d", len(cat), len(table))
	}
	for i, c := range cat {
		if e := table[i]; c.ID != e.id || c.Group != e.group || c.Rule != e.rule || c.Anchor != protocolDoc+"#"+e.anchor {
			t.Errorf("Catalog()[%d] = %+v, want the table's %q", i, c, e.id)
		}
	}
}

// Every case's anchor is a heading of docs/protocol.md, and its rule is one
// line quoted from that heading's section (its subsections included):
// a rule changed in the document fails here until the case follows it.
func TestCaseRulesAreQuotedFromTheirProtocolSection(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(protocolDoc)))
	if err != nil {
		t.Fatal(err)
	}
	sections := headingSections(string(b))
	for _, c := range Catalog() {
		doc, frag, _ := strings.Cut(c.Anchor, "#")
		if doc != protocolDoc {
			t.Errorf("%s: anchor %q is not in %s", c.ID, c.Anchor, protocolDoc)
			continue
		}
		text, ok := sections[frag]
		if !ok {
			t.Errorf("%s: anchor %q names no heading of %s", c.ID, c.Anchor, protocolDoc)
			continue
		}
		if c.Rule == "" || strings.ContainsAny(c.Rule, "\n`*") {
			t.Errorf("%s: rule %q: want one line, without Markdown", c.ID, c.Rule)
			continue
		}
		// Each part of the quote is in the section, after the one before.
		rest := normalize(text)
		for _, part := range strings.Split(c.Rule, "…") {
			part = strings.TrimSpace(part)
			i := strings.Index(rest, part)
			if part == "" || i < 0 {
				t.Errorf("%s: rule %q: %q is not in %s, after the quote's parts before it", c.ID, c.Rule, part, c.Anchor)
				break
			}
			rest = rest[i+len(part):]
		}
	}
}

var heading = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*$`)

// headingSections maps the anchor of each heading of a Markdown document
// (GitHub's: lower case, punctuation dropped, spaces as hyphens, "-1",
// "-2"... on repeats) to its section: the text up to the next heading of
// its level or above.
func headingSections(doc string) map[string]string {
	type head struct {
		level  int
		anchor string
		start  int // line index of the heading
	}
	lines := strings.Split(doc, "\n")
	var heads []head
	count := map[string]int{}
	fence := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
		}
		m := heading.FindStringSubmatch(l)
		if fence || m == nil {
			continue
		}
		a := slug(m[2])
		if n := count[a]; n > 0 {
			count[a]++
			a += "-" + strconv.Itoa(n)
		} else {
			count[a] = 1
		}
		heads = append(heads, head{len(m[1]), a, i})
	}
	out := map[string]string{}
	for i, h := range heads {
		end := len(lines)
		for _, next := range heads[i+1:] {
			if next.level <= h.level {
				end = next.start
				break
			}
		}
		out[h.anchor] = strings.Join(lines[h.start+1:end], "\n")
	}
	return out
}

// slug is GitHub's anchor of a heading's text.
func slug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// normalize is Markdown text as a rule quotes it: backquotes and bold
// marks dropped, runs of white space (line breaks too) as one space.
func normalize(md string) string {
	md = strings.NewReplacer("`", "", "**", "").Replace(md)
	return strings.Join(strings.Fields(md), " ")
}

// WriteCatalog writes a line per case, ID, group and rule in columns, and
// WriteCatalogJSON the same cases as JSON.
func TestWriteCatalog(t *testing.T) {
	var text, js strings.Builder
	if err := WriteCatalog(&text); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(text.String(), "\n"), "\n")
	cat := Catalog()
	if len(lines) != len(cat) {
		t.Fatalf("%d lines for %d cases:\n%s", len(lines), len(cat), text.String())
	}
	col := strings.Index(lines[0], cat[0].Group)
	for i, c := range cat {
		f := strings.Fields(lines[i])
		if f[0] != c.ID || f[1] != c.Group || !strings.HasSuffix(lines[i], " "+c.Rule+" ("+c.Anchor+")") || strings.Index(lines[i], "  "+c.Group+"  ") != col-2 {
			t.Errorf("line %q: want %s, %s in the group column, then %q (%s)", lines[i], c.ID, c.Group, c.Rule, c.Anchor)
		}
	}
	if err := WriteCatalogJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got struct{ Cases []CaseInfo }
	if err := json.Unmarshal([]byte(js.String()), &got); err != nil || !slices.Equal(got.Cases, cat) {
		t.Errorf("WriteCatalogJSON = %s (%v), want Catalog()", js.String(), err)
	}
	if !strings.Contains(js.String(), `"id":"transport/socket","group":"idle"`) {
		t.Errorf("WriteCatalogJSON = %s: want the fields id, group, rule, anchor", js.String())
	}
}
