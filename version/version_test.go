package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func build(main string, settings ...string) *debug.BuildInfo {
	bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/handoff-dev/handoff", Version: main}}
	for i := 0; i+1 < len(settings); i += 2 {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
	}
	return bi
}

// The stamped version wins; then go install's module version; then the VCS
// stamp; then "dev". Build metadata never survives: an image tag and a
// label value cannot hold "+".
func TestFromBuild(t *testing.T) {
	const rev = "2c1ee26e64e7f4d846a77d6bda98f28ef09966bf"
	for _, tc := range []struct {
		name, stamped string
		bi            *debug.BuildInfo
		want          string
	}{
		{"ldflags", "v0.2.0", build("v0.1.0", "vcs.revision", rev), "v0.2.0"},
		{"ldflags dev", "v0.2.1-dev.3.g2c1ee26", build("(devel)"), "v0.2.1-dev.3.g2c1ee26"},
		{"go install at a tag", "", build("v0.2.0"), "v0.2.0"},
		{"go install at a commit", "", build("v0.2.1-0.20261203124216-2c1ee26e64e7"), "v0.2.1-0.20261203124216-2c1ee26e64e7"},
		{"go build, tagged, dirty", "", build("v0.2.0+dirty", "vcs.revision", rev, "vcs.modified", "true"), "v0.2.0-dirty"},
		{"go build, untagged, dirty", "", build("v0.0.0-20261203124216-2c1ee26e64e7+dirty"), "v0.0.0-20261203124216-2c1ee26e64e7.dirty"},
		{"devel with VCS", "", build("(devel)", "vcs.revision", rev, "vcs.modified", "false"), "v0.0.0-dev.g2c1ee26e64e7"},
		{"devel with VCS, dirty", "", build("(devel)", "vcs.revision", rev, "vcs.modified", "true"), "v0.0.0-dev.g2c1ee26e64e7.dirty"},
		{"devel without VCS", "", build("(devel)"), Dev},
		{"test binary", "", build(""), Dev},
		{"no build information", "", nil, Dev},
	} {
		if got := fromBuild(tc.stamped, tc.bi); got != tc.want {
			t.Errorf("%s: fromBuild(%q, %v) = %q, want %q", tc.name, tc.stamped, tc.bi, got, tc.want)
		}
	}
}

func TestCommitFromBuild(t *testing.T) {
	const rev = "2c1ee26e64e7f4d846a77d6bda98f28ef09966bf"
	if got := commitFromBuild("abc", build("", "vcs.revision", rev)); got != "abc" {
		t.Errorf("stamped commit: %q, want abc", got)
	}
	if got := commitFromBuild("", build("", "vcs.revision", rev)); got != rev {
		t.Errorf("VCS commit: %q, want %s", got, rev)
	}
	if got := commitFromBuild("", build("v0.2.0")); got != "" {
		t.Errorf("no commit: %q, want empty", got)
	}
}

func TestReleased(t *testing.T) {
	for v, want := range map[string]bool{
		"v0.2.0":                                    true,
		"v1.10.3":                                   true,
		"v0.2.0-rc.1":                               true,
		"v0.2.1-dev.3.g2c1ee26":                     false,
		"v0.0.0-dev.398.g2c1ee26.dirty":             false,
		"v0.2.0-rc.1.dev.2.gabc1234":                false,
		"v0.2.0-dirty":                              false,
		"v0.0.0-dev":                                false,
		"v0.0.0-20261203124216-2c1ee26e64e7":        false,
		"v0.2.1-0.20261203124216-2c1ee26e64e7":      false,
		"v0.2.0-rc.1.0.20261203124216-2c1ee26e64e7": false,
		"dev":            false,
		"0.2.0":          false,
		"v0.2":           false,
		"v01.2.3":        false,
		"v0.2.0+build.1": false,
		"":               false,
	} {
		if got := Released(v); got != want {
			t.Errorf("Released(%q) = %v, want %v", v, got, want)
		}
	}
}

// A real build stamped as the Makefile stamps it prints the stamped version
// and commit, and the Makefile's LDFLAGS, ko's configuration and
// hack/release.sh's binaries stamp exactly these variables.
func TestLdflagsStampTheBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	for file, stamps := range map[string][]string{
		"../Makefile":        {"-X github.com/handoff-dev/handoff/version.version=$(VERSION)", "-X github.com/handoff-dev/handoff/version.commit=$(COMMIT)"},
		"../.ko.yaml":        {"-X github.com/handoff-dev/handoff/version.version={{.Env.VERSION}}", "-X github.com/handoff-dev/handoff/version.commit={{.Env.COMMIT}}"},
		"../hack/release.sh": {"-X github.com/handoff-dev/handoff/version.version=$VERSION", "-X github.com/handoff-dev/handoff/version.commit=$COMMIT"},
	} {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range stamps {
			if !strings.Contains(string(text), want) {
				t.Errorf("%s lacks %s", file, want)
			}
		}
		if strings.Contains(string(text), "main.version") {
			t.Errorf("%s still stamps main.version, which is gone", file)
		}
	}
	// Nothing else stamps the variable that is gone (a release script, ko's
	// configuration, a workflow): -X of a missing variable is silently
	// ignored, and the build would print "dev".
	if files, err := exec.Command("git", "-C", "..", "ls-files").Output(); err == nil {
		for _, f := range strings.Fields(string(files)) {
			if strings.HasSuffix(f, ".md") || strings.HasSuffix(f, "_test.go") {
				continue
			}
			if text, err := os.ReadFile(filepath.Join("..", f)); err == nil && strings.Contains(string(text), "-X main.version") {
				t.Errorf("%s stamps -X main.version, which is gone: stamp github.com/handoff-dev/handoff/version.version (and .commit) as the Makefile's LDFLAGS do", f)
			}
		}
	}
	dir := t.TempDir()
	main := filepath.Join(dir, "main.go")
	src := "package main\n\nimport (\n\t\"encoding/json\"\n\t\"os\"\n\n\t\"github.com/handoff-dev/handoff/version\"\n)\n\nfunc main() { _ = json.NewEncoder(os.Stdout).Encode(version.GetInfo()) }\n"
	if err := os.WriteFile(main, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "v")
	ldflags := "-X github.com/handoff-dev/handoff/version.version=v9.8.7-rc.1 -X github.com/handoff-dev/handoff/version.commit=0123456789abcdef0123456789abcdef01234567"
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, main).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"version":"v9.8.7-rc.1","commit":"0123456789abcdef0123456789abcdef01234567","goVersion":"` + runtime.Version() + `","platform":"` + runtime.GOOS + "/" + runtime.GOARCH + `"}`
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("stamped build prints\n%s\nwant\n%s", got, want)
	}
}

// A release's docs are at its tag; a development build's at main.
func TestDocsBase(t *testing.T) {
	for v, want := range map[string]string{
		"v0.2.0":                "https://github.com/handoff-dev/handoff/blob/v0.2.0/",
		"v0.2.0-rc.1":           "https://github.com/handoff-dev/handoff/blob/v0.2.0-rc.1/",
		"v0.2.1-dev.3.g2c1ee26": "https://github.com/handoff-dev/handoff/blob/main/",
		"v0.0.0-dev":            "https://github.com/handoff-dev/handoff/blob/main/",
		"":                      "https://github.com/handoff-dev/handoff/blob/main/",
	} {
		if got := DocsBase(v); got != want {
			t.Errorf("DocsBase(%q) = %s, want %s", v, got, want)
		}
	}
}
