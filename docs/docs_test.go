// Package docs_test checks that the documentation says what the repository
// does: every test, benchmark or fuzz target it names exists, the supported
// Kubernetes versions read the same in the README, the chart and the
// Makefile, the packages run on the newest are every one that talks to the
// API, and the make bench commands it lists are the Makefile's.
package docs_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// root is the repository's top, from this package's directory.
const root = ".."

// docs returns the Markdown files of the repository, by path from root.
func docs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			out[path] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no Markdown files found")
	}
	return out
}

var (
	// A Go function's name as Go declares it, method or not.
	funcDecl = regexp.MustCompile(`(?m)^func\s+(?:\([^)]*\)\s*)?([A-Z][A-Za-z0-9_]*)`)
	// A test, benchmark or fuzz target's name as the docs write it.
	testRef = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*`)
	// A name given to go test -run or -bench: a prefix is enough there.
	runFlag = regexp.MustCompile(`-(?:run|bench)[ =]'?\^?((?:Test|Benchmark|Fuzz)?[A-Z][A-Za-z0-9_]*)`)
)

// funcs returns the names of the functions declared in the repository's Go
// files (tests, benchmarks and fuzz targets among them; the e2e suite's too,
// whatever its build tags).
func funcs(t *testing.T) []string {
	t.Helper()
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != root {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range funcDecl.FindAllStringSubmatch(string(b), -1) {
				seen[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Every test, benchmark and fuzz target a document names is declared, so a
// renamed test cannot leave the reliability and performance tables pointing
// at nothing. A name given to -run or -bench may be a prefix of one.
func TestDocsNameOnlyTestsThatExist(t *testing.T) {
	names := funcs(t)
	declared := map[string]bool{}
	for _, n := range names {
		declared[n] = true
	}
	for path, text := range docs(t) {
		prefixes := map[string]bool{}
		for _, m := range runFlag.FindAllStringSubmatch(text, -1) {
			prefixes[m[1]] = true
		}
		for _, ref := range testRef.FindAllString(text, -1) {
			if declared[ref] {
				continue
			}
			if prefixes[ref] && slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, ref) }) {
				continue
			}
			t.Errorf("%s names %s, which no Go file declares (renamed or removed?)", path, ref)
		}
	}
}

// The supported Kubernetes versions read the same everywhere: the README's
// "Supported Kubernetes: A to B", the chart's kubeVersion (>= A), handoff
// check's minimum (A) and the versions the Makefile tests on (KUBE_OLDEST
// is A, KUBE_NEWEST is B).
func TestSupportedKubernetesVersionsAgree(t *testing.T) {
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	find := func(path, text string, re *regexp.Regexp) []string {
		m := re.FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("%s: nothing matches %s", path, re)
		}
		return m[1:]
	}
	readme := find("README.md", read("README.md"), regexp.MustCompile(`Supported Kubernetes: (1\.\d+) to (1\.\d+)\.`))
	chart := find("charts/handoff/Chart.yaml", read("charts/handoff/Chart.yaml"), regexp.MustCompile(`(?m)^kubeVersion: ">=(1\.\d+)\.0-0"`))
	makefile := read("Makefile")
	oldest := find("Makefile", makefile, regexp.MustCompile(`(?m)^KUBE_OLDEST := KUBE_VERSION=v(1\.\d+)\.`))
	newest := find("Makefile", makefile, regexp.MustCompile(`(?m)^KUBE_NEWEST := KUBE_VERSION=v(1\.\d+)\.`))
	check := find("internal/cli/check/runner.go", read("internal/cli/check/runner.go"), regexp.MustCompile(`(?m)^const minKubernetes = "(1\.\d+)\.0"`))
	if readme[0] != chart[0] || readme[0] != oldest[0] || readme[0] != check[0] {
		t.Errorf("oldest supported Kubernetes: README %s, Chart.yaml kubeVersion >=%s, Makefile KUBE_OLDEST %s, handoff check's minKubernetes %s; want one version", readme[0], chart[0], oldest[0], check[0])
	}
	if readme[1] != newest[0] {
		t.Errorf("newest supported Kubernetes: README %s, Makefile KUBE_NEWEST %s; want one version", readme[1], newest[0])
	}
	// Anything else that states a minimum ("Kubernetes 1.N or later",
	// "1.N+") names the supported range's, or a feature's history.
	minimum := regexp.MustCompile(`Kubernetes (1\.\d+) or later|Kubernetes (1\.\d+)\+`)
	for path, text := range docs(t) {
		for _, m := range minimum.FindAllStringSubmatch(text, -1) {
			if v := m[1] + m[2]; v != readme[0] {
				t.Errorf("%s says %q; the oldest supported Kubernetes is %s (README)", path, m[0], readme[0])
			}
		}
	}
}

// The Makefile's API_PKGS, which make integration-newest (in make test)
// runs on the newest supported Kubernetes, are the packages whose tests
// talk to an apiserver: those with a _test.go file that imports
// internal/kubetest, outside the e2e suite (make e2e-newest's). A new such
// package missing from the list would be tested on the oldest alone.
func TestAPIPackagesAreTheMakefiles(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^API_PKGS := (.*)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Makefile: no API_PKGS := line")
	}
	listed := strings.Fields(string(m[1]))
	const kubetest = "github.com/handoff-dev/handoff/internal/kubetest"
	var found []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "node_modules" || d.Name() == "testdata" || path == filepath.Join(root, "e2e")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == kubetest {
				rel, err := filepath.Rel(root, filepath.Dir(path))
				if err != nil {
					return err
				}
				found = append(found, "./"+filepath.ToSlash(rel))
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(found)
	found = slices.Compact(found)
	if len(found) == 0 {
		t.Fatal("no _test.go file imports " + kubetest)
	}
	sorted := slices.Sorted(slices.Values(listed))
	if !slices.Equal(sorted, found) {
		t.Errorf("Makefile's API_PKGS are\n\t%s\nthe packages whose tests import internal/kubetest are\n\t%s", strings.Join(sorted, " "), strings.Join(found, " "))
	}
}

// docs/performance.md lists the commands of make bench as the Makefile runs
// them.
func TestBenchCommandsAreTheMakefiles(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	recipe := regexp.MustCompile(`(?m)^bench:.*\n((?:\t.*\n)+)`).FindSubmatch(b)
	if recipe == nil {
		t.Fatal("Makefile: no bench target")
	}
	var want []string
	for _, line := range strings.Split(strings.TrimSpace(string(recipe[1])), "\n") {
		// The command, without the KUBEBUILDER_ASSETS=... before it.
		line = strings.TrimSpace(line)
		if i := strings.Index(line, " go "); i >= 0 {
			line = line[i+1:]
		}
		want = append(want, strings.ReplaceAll(line, "$$", "$"))
	}
	p, err := os.ReadFile(filepath.Join(root, "docs", "performance.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```sh\nmake bench[^\n]*\n(.*?)```").FindSubmatch(p)
	if block == nil {
		t.Fatal("docs/performance.md: no make bench block")
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(block[1])), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if strings.HasPrefix(line, "go ") {
			got = append(got, line)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("docs/performance.md lists make bench as\n\t%s\nthe Makefile runs\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}
