package charts_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite each chart's README values table")

// The README's generated part lies between these markers; the rest is
// written by hand.
const (
	valuesBegin = "<!-- values:begin (go test ./charts -run TestChartREADMEs -update) -->"
	valuesEnd   = "<!-- values:end -->"
)

// valueRow is one row of a chart's values table.
type valueRow struct {
	key, typ, def, desc string
}

var keyLine = regexp.MustCompile(`^( *)([A-Za-z0-9_]+):(?: (.*))?$`)

// valueRows reads values.yaml as written: each key with its comment above
// (prose only: lines indented as code, examples, are left out), its
// default as written, and the schema's type; a key whose value is a map
// written below it gets a row only when it has a comment, its keys
// theirs. values.yaml is the chart's own, in plain block style, which is
// all this reads.
func valueRows(t *testing.T, values []byte, schema map[string]any) []valueRow {
	t.Helper()
	var rows []valueRow
	var comment []string
	type level struct {
		indent int
		key    string
	}
	var stack []level
	inExample := false
	for _, line := range strings.Split(string(values), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "":
			comment, inExample = nil, false
			continue
		case strings.HasPrefix(trimmed, "#"):
			text := strings.TrimPrefix(strings.TrimPrefix(trimmed, "#"), " ")
			// An example: indented under the prose, or a YAML line.
			if strings.HasPrefix(text, " ") || inExample {
				inExample = true
				comment = append(comment, exampleMark)
				continue
			}
			comment = append(comment, text)
			continue
		case strings.HasPrefix(trimmed, "- "):
			continue // an item of a list written below its key
		}
		inExample = false
		m := keyLine.FindStringSubmatch(line)
		if m == nil {
			continue // a list item's fields, a multi-line value
		}
		indent, key, value := len(m[1]), m[2], strings.TrimSpace(m[3])
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		var path []string
		for _, l := range stack {
			path = append(path, l.key)
		}
		path = append(path, key)
		full := strings.Join(path, ".")
		var prose []string
		for _, c := range comment {
			if c != exampleMark {
				prose = append(prose, c)
			}
		}
		desc := strings.Join(prose, " ")
		if strings.HasSuffix(desc, ":") && inExampleSeen(comment) {
			desc += " (see values.yaml)"
		}
		comment = nil
		s := schemaAt(schema, path)
		if desc == "" {
			desc, _ = s["description"].(string)
		}
		if value == "" {
			stack = append(stack, level{indent, key})
			if desc == "" {
				continue
			}
			rows = append(rows, valueRow{full, schemaType(s), "", desc})
			continue
		}
		rows = append(rows, valueRow{full, schemaType(s), value, desc})
	}
	return rows
}

// exampleMark stands in a key's comment for a line of example left out.
const exampleMark = "\x00example"

// inExampleSeen reports whether a comment had an example left out, and
// drops the marks.
func inExampleSeen(comment []string) bool {
	return slices.Contains(comment, exampleMark)
}

// documented reports whether the schema knows key: it has a schema of its
// own, or lies under an object the schema leaves open (resources, labels,
// a securityContext's seccompProfile).
func documented(schema map[string]any, key string) bool {
	path := strings.Split(key, ".")
	for i := len(path); i > 0; i-- {
		s := schemaAt(schema, path[:i])
		if s == nil {
			continue
		}
		_, closed := s["properties"]
		return i == len(path) || !closed || s["additionalProperties"] != false
	}
	return false
}

// schemaAt is the JSON schema of the value at path, nil if it has none.
func schemaAt(s map[string]any, path []string) map[string]any {
	for _, k := range path {
		props, _ := s["properties"].(map[string]any)
		next, _ := props[k].(map[string]any)
		if next == nil {
			return nil
		}
		s = next
	}
	return s
}

// schemaType says a schema's type: its type or types, or its enum.
func schemaType(s map[string]any) string {
	switch t := s["type"].(type) {
	case string:
		return t
	case []any:
		var out []string
		for _, x := range t {
			out = append(out, fmt.Sprint(x))
		}
		return strings.Join(out, " or ")
	}
	if e, ok := s["enum"].([]any); ok {
		var out []string
		for _, x := range e {
			if x == "" {
				x = `""`
			}
			out = append(out, fmt.Sprint(x))
		}
		return "one of " + strings.Join(out, ", ")
	}
	return ""
}

// valuesTable renders the rows as a Markdown table.
func valuesTable(rows []valueRow) string {
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	code := func(s string) string {
		if s == "" {
			return ""
		}
		return "`" + strings.ReplaceAll(s, "`", "'") + "`"
	}
	var b strings.Builder
	b.WriteString("| Key | Type | Default | Description |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.key, cell(r.typ), cell(code(r.def)), cell(r.desc))
	}
	return b.String()
}

// Each chart has a README.md (what `helm show readme` prints) whose values
// table is generated from its values.yaml (comments and defaults) and
// values.schema.json (types), as helm-docs would: every key of values.yaml
// is in it, and it is current (-update rewrites it). Its Chart.yaml has
// ArtifactHub's annotations.
func TestChartREADMEs(t *testing.T) {
	for _, chart := range []string{"handoff", "handoff-workload"} {
		t.Run(chart, func(t *testing.T) {
			dir := filepath.Join(".", chart)
			values, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(filepath.Join(dir, "values.schema.json"))
			if err != nil {
				t.Fatal(err)
			}
			var schema map[string]any
			if err := json.Unmarshal(raw, &schema); err != nil {
				t.Fatal(err)
			}
			rows := valueRows(t, values, schema)
			keys := map[string]bool{}
			for _, r := range rows {
				keys[r.key] = true
			}
			// Every top-level key of the schema is documented, and every
			// row is a key the schema knows.
			props, _ := schema["properties"].(map[string]any)
			for k := range props {
				found := false
				for key := range keys {
					if key == k || strings.HasPrefix(key, k+".") {
						found = true
					}
				}
				// global: an umbrella's, which Helm always gives.
				if !found && k != "enabled" && k != "global" {
					t.Errorf("%s: values key %s is in the schema but not in the README's table (give it a default in values.yaml)", chart, k)
				}
			}
			for _, r := range rows {
				if !documented(schema, r.key) {
					t.Errorf("%s: README row %s: not a key of values.schema.json", chart, r.key)
				}
			}
			path := filepath.Join(dir, "README.md")
			readme, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v: each chart has a README.md, which helm show readme prints", err)
			}
			before, rest, ok1 := bytes.Cut(readme, []byte(valuesBegin))
			_, after, ok2 := bytes.Cut(rest, []byte(valuesEnd))
			if !ok1 || !ok2 {
				t.Fatalf("%s: no %s … %s markers", path, valuesBegin, valuesEnd)
			}
			want := string(before) + valuesBegin + "\n" + valuesTable(rows) + valuesEnd + string(after)
			if *update {
				if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
					t.Fatal(err)
				}
				readme = []byte(want)
			}
			if string(readme) != want {
				t.Errorf("%s: the values table is not current; run go test ./charts -run TestChartREADMEs -update", path)
			}
			meta, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range []string{"artifacthub.io/license:", "artifacthub.io/links:", "artifacthub.io/changes:", "artifacthub.io/category:"} {
				if !bytes.Contains(meta, []byte(a)) {
					t.Errorf("%s/Chart.yaml: no annotation %s", chart, a)
				}
			}
			if chart == "handoff" && !bytes.Contains(meta, []byte("artifacthub.io/images:")) {
				t.Errorf("%s/Chart.yaml: no annotation artifacthub.io/images", chart)
			}
		})
	}
}
