package main

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestSDKVersionsComeFromTheRelease: the release version has one source,
// the tag (hack/version.sh, VERSION): no SDK's package metadata in the
// tree holds a version of its own. Each says 0.0.0 where its format needs
// one, which hack/release.sh sdk stamps in a copy (and refuses to build if
// the placeholder moved); the gem takes its version from the build
// (HANDOFF_GEM_VERSION). TestReleaseSnapshot checks the packages it
// builds carry the release's version.
func TestSDKVersionsComeFromTheRelease(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		data, err := os.ReadFile("../../" + path)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	// Python: pyproject takes the version from handoff.__version__.
	if py := read("sdk/python/pyproject.toml"); !strings.Contains(py, `dynamic = ["version"]`) ||
		!strings.Contains(py, `version = {attr = "handoff.__version__"}`) || regexp.MustCompile(`(?m)^version\s*=\s*"`).MatchString(py) {
		t.Error(`sdk/python/pyproject.toml: want dynamic = ["version"] from handoff.__version__ and no version of its own`)
	}
	if n := regexp.MustCompile(`(?m)^__version__ = "0\.0\.0"$`).FindAllString(read("sdk/python/src/handoff/__init__.py"), -1); len(n) != 1 {
		t.Errorf(`sdk/python/src/handoff/__init__.py: %d lines __version__ = "0.0.0", want 1 (hack/release.sh sdk stamps it)`, len(n))
	}
	// npm: both packages at 0.0.0 under the project's scope, bullmq's peer
	// dependency on the worker at ^0.0.0; the lock agrees.
	for path, name := range map[string]string{"sdk/node/package.json": "@handoff-dev/worker", "sdk/node/bullmq/package.json": "@handoff-dev/bullmq"} {
		var p struct {
			Name             string            `json:"name"`
			Version          string            `json:"version"`
			PeerDependencies map[string]string `json:"peerDependencies"`
		}
		if err := json.Unmarshal([]byte(read(path)), &p); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if p.Name != name || p.Version != "0.0.0" {
			t.Errorf("%s: name %q, version %q: want %s at 0.0.0 (the release stamps its version)", path, p.Name, p.Version, name)
		}
		if peer, ok := p.PeerDependencies["@handoff-dev/worker"]; ok && peer != "^0.0.0" {
			t.Errorf("%s: peerDependencies[@handoff-dev/worker] %q, want ^0.0.0 (the release stamps ^VERSION)", path, peer)
		}
	}
	var lock struct {
		Packages map[string]struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"packages"`
	}
	if err := json.Unmarshal([]byte(read("sdk/node/package-lock.json")), &lock); err != nil {
		t.Fatal(err)
	}
	for key, name := range map[string]string{"": "@handoff-dev/worker", "bullmq": "@handoff-dev/bullmq"} {
		if p := lock.Packages[key]; p.Name != name || p.Version != "0.0.0" {
			t.Errorf("sdk/node/package-lock.json: packages[%q] %+v, want %s at 0.0.0", key, p, name)
		}
	}
	// Ruby: the gemspec's version is the build's, 0.0.0 in a checkout.
	if gs := read("sdk/ruby/handoff.gemspec"); !strings.Contains(gs, `ENV.fetch("HANDOFF_GEM_VERSION", "")`) {
		t.Error("sdk/ruby/handoff.gemspec: want its version from HANDOFF_GEM_VERSION (sdk/ruby/build-gem.sh passes the release's)")
	}
	if !strings.Contains(read("sdk/ruby/lib/handoff/version.rb"), `|| "0.0.0"`) {
		t.Error(`sdk/ruby/lib/handoff/version.rb: want "0.0.0" outside an installed gem`)
	}
}
