package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// snapshotVersion is a build between tags, as hack/version.sh names one:
// every registry's spelling of it differs from the tag's.
const snapshotVersion = "v1.2.3-rc.4.dev.5.gabc1234"

// TestReleaseSnapshot runs hack/release.sh as make release does, without
// the images (ko's builds: the e2e suite makes, signs and checks them) and
// with the binary for this machine's platform alone (BIN_PLATFORMS), into
// a directory of its own with a loopback registry of its own: steps
// notes, chart, binaries, sdk, sbom (see below) and checksums. Then:
// dist/release holds exactly the expected assets, each at the version
// (releasekit verify, in process), checksums.txt covers every file
// (sha256sum -c) and its cosign signature verifies (and refuses a
// changed checksums.txt); the notes are the CHANGELOG's; and each package
// installs from its file and says the version: the binary's `handoff
// version`, the wheel imported, the npm package installed offline, the
// gem installed.
//
// The SBOMs need syft, whose cold build takes about 9 minutes, which CI's
// test path does not pay: the sbom step runs when syft is already built at
// its pinned version (hack/tools.sh release), or HANDOFF_RELEASE_SBOM=1
// (make release-snapshot: builds it if missing); HANDOFF_RELEASE_SBOM=0
// leaves it out.
func TestReleaseSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a release of the repository (binary, charts, SDK packages); not under -short")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := exec.Command("bash", filepath.Join(root, "hack/tools.sh")).Output()
	if err != nil {
		t.Fatalf("hack/tools.sh: %v", err)
	}
	bin := strings.TrimSpace(string(tools))
	withSBOM := sbomWanted(t, root, bin)

	dist := t.TempDir()
	steps := []string{"notes", "chart", "binaries", "sdk"}
	if withSBOM {
		steps = append(steps, "sbom")
	}
	steps = append(steps, "checksums")
	cmd := exec.Command("bash", append([]string{"hack/release.sh"}, steps...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "VERSION="+snapshotVersion, "DIST="+dist, "BIN_PLATFORMS=linux/"+runtime.GOARCH,
		"SIGN=key", "COSIGN_KEY=", "COSIGN_PASSWORD=", "REGISTRY=", "RELEASE_PORT="+strconv.Itoa(freePort(t)),
		"HANDOFF_WATCH_PID="+strconv.Itoa(os.Getpid()))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/release.sh %s: %v\n%s", strings.Join(steps, " "), err, out)
	}
	t.Logf("hack/release.sh %s: %.0f s", strings.Join(steps, " "), time.Since(start).Seconds())

	reg, err := registryVersions(snapshotVersion)
	if err != nil {
		t.Fatal(err)
	}
	rel := filepath.Join(dist, "release")
	binary := "handoff-linux-" + runtime.GOARCH
	packages := []string{
		binary,
		"handoff-" + reg.Python + "-py3-none-any.whl", "handoff-" + reg.Python + ".tar.gz",
		"handoff-dev-worker-" + reg.NPM + ".tgz", "handoff-dev-bullmq-" + reg.NPM + ".tgz",
		"handoff-" + reg.Gem + ".gem",
	}
	want := append([]string{
		"kubectl-handoff-linux-" + runtime.GOARCH + ".tar.gz", "handoff.yaml", "LICENSE",
		"handoff-" + snapshotVersion + ".tgz", "handoff-workload-" + snapshotVersion + ".tgz",
		"checksums.txt", "checksums.txt.sig",
	}, packages...)
	if withSBOM {
		for _, p := range packages {
			want = append(want, p+".spdx.json")
		}
	}
	entries, err := os.ReadDir(rel)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s holds\n  %s\nwant\n  %s", rel, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	assets, err := verify(rel, snapshotVersion)
	if err != nil {
		t.Errorf("releasekit verify: %v", err)
	}
	for _, a := range assets {
		t.Logf("%-60s %10d bytes  sha256:%s", a.Name, a.Size, a.SHA256)
	}

	run := func(dir string, env []string, name string, args ...string) string {
		t.Helper()
		c := exec.Command(name, args...)
		c.Dir = dir
		c.Env = append(os.Environ(), env...)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// What a user runs on the downloaded assets.
	run(rel, nil, "sha256sum", "--strict", "-c", "checksums.txt")
	verifyBlob := func(file string) error {
		return exec.Command(filepath.Join(bin, "cosign"), "verify-blob", "--key", filepath.Join(dist, "cosign.pub"),
			"--insecure-ignore-tlog=true", "--signature", filepath.Join(rel, "checksums.txt.sig"), file).Run()
	}
	if err := verifyBlob(filepath.Join(rel, "checksums.txt")); err != nil {
		t.Errorf("cosign verify-blob checksums.txt: %v", err)
	}
	sums, err := os.ReadFile(filepath.Join(rel, "checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	changed := filepath.Join(t.TempDir(), "checksums.txt")
	if err := os.WriteFile(changed, append(sums, "0000000000000000000000000000000000000000000000000000000000000000  extra\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := verifyBlob(changed); err == nil {
		t.Error("cosign verify-blob passed a changed checksums.txt")
	}

	// The notes: the CHANGELOG's section for the version (its Unreleased one).
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	wantNotes, err := releaseNotes(string(changelog), snapshotVersion)
	if err != nil {
		t.Fatal(err)
	}
	if notes, err := os.ReadFile(filepath.Join(dist, "notes.md")); err != nil || string(notes) != wantNotes {
		t.Errorf("notes.md: %v; want the CHANGELOG's section for %s (%d bytes), got %d bytes", err, snapshotVersion, len(wantNotes), len(notes))
	}

	// Installed from its file, each says the version.
	if out := run(rel, nil, filepath.Join(rel, binary), "version", "--client"); !strings.HasPrefix(out, "Client version: "+snapshotVersion+" (") {
		t.Errorf("%s version --client: %q, want Client version: %s", binary, out, snapshotVersion)
	}
	wheel := t.TempDir()
	run(wheel, nil, "python3", "-m", "zipfile", "-e", filepath.Join(rel, "handoff-"+reg.Python+"-py3-none-any.whl"), ".")
	if out := run(t.TempDir(), []string{"PYTHONPATH=" + wheel}, "python3", "-c", "import handoff, handoff.aio; print(handoff.__version__, handoff.__file__)"); out != reg.Python+" "+filepath.Join(wheel, "handoff", "__init__.py")+"\n" {
		t.Errorf("the wheel's handoff: %q, want __version__ %s from %s", out, reg.Python, wheel)
	}
	app := t.TempDir()
	if err := os.WriteFile(filepath.Join(app, "package.json"), []byte(`{"name": "app", "private": true, "type": "module"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	run(app, nil, "npm", "install", "--offline", "--no-audit", "--no-fund", "--loglevel=error", filepath.Join(rel, "handoff-dev-worker-"+reg.NPM+".tgz"))
	if out := run(app, nil, "node", "--input-type=module", "-e",
		`import { Agent } from '@handoff-dev/worker'; import { createRequire } from 'node:module';
		 console.log(typeof Agent, createRequire(import.meta.url)('@handoff-dev/worker/package.json').version)`); out != "function "+reg.NPM+"\n" {
		t.Errorf("@handoff-dev/worker installed from its package: %q, want its Agent and version %s", out, reg.NPM)
	}
	gems := t.TempDir()
	env := []string{"GEM_HOME=" + gems, "GEM_PATH=" + gems}
	run(gems, env, "gem", "install", "--local", "--no-document", filepath.Join(rel, "handoff-"+reg.Gem+".gem"))
	if out := run(t.TempDir(), env, "ruby", "-e", `require "handoff"; puts Handoff::VERSION`); out != reg.Gem+"\n" {
		t.Errorf("the gem installed: Handoff::VERSION %q, want %s", out, reg.Gem)
	}

	// The binary's SBOM lists the Go modules linked into it; each SDK
	// package's lists the package at its registry's version.
	if withSBOM {
		for file, want := range map[string][]string{
			binary: {"k8s.io/client-go@v", "github.com/handoff-dev/handoff/protocol@"},
			"handoff-" + reg.Python + "-py3-none-any.whl": {"handoff@" + reg.Python},
			"handoff-" + reg.Python + ".tar.gz":           {"handoff@" + reg.Python},
			"handoff-dev-worker-" + reg.NPM + ".tgz":      {"@handoff-dev/worker@" + reg.NPM},
			"handoff-dev-bullmq-" + reg.NPM + ".tgz":      {"@handoff-dev/bullmq@" + reg.NPM},
			"handoff-" + reg.Gem + ".gem":                 {"handoff@" + reg.Gem},
		} {
			data, err := os.ReadFile(filepath.Join(rel, file+".spdx.json"))
			if err != nil {
				t.Error(err)
				continue
			}
			var doc struct {
				Packages []struct {
					Name        string `json:"name"`
					VersionInfo string `json:"versionInfo"`
				} `json:"packages"`
			}
			if err := json.Unmarshal(data, &doc); err != nil {
				t.Fatalf("%s.spdx.json: %v", file, err)
			}
			var names []string
			for _, p := range doc.Packages {
				names = append(names, p.Name+"@"+p.VersionInfo)
			}
			for _, w := range want {
				if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, w) }) {
					t.Errorf("%s.spdx.json lists no %s: %v", file, w, names)
				}
			}
		}
	}
}

// sbomWanted says whether TestReleaseSnapshot runs the sbom step:
// HANDOFF_RELEASE_SBOM=1 or 0, else whether syft is built at its pin.
func sbomWanted(t *testing.T, root, bin string) bool {
	switch v := os.Getenv("HANDOFF_RELEASE_SBOM"); v {
	case "1":
		return true
	case "0":
		t.Log("HANDOFF_RELEASE_SBOM=0: no sbom step")
		return false
	case "":
	default:
		t.Fatalf("HANDOFF_RELEASE_SBOM=%q: want 1, 0 or unset", v)
	}
	tools, err := os.ReadFile(filepath.Join(root, "hack/tools.sh"))
	if err != nil {
		t.Fatal(err)
	}
	pin := regexp.MustCompile(`(?m)^syft=\S+@(v\S+)$`).FindSubmatch(tools)
	if pin == nil {
		t.Fatal("hack/tools.sh pins no syft")
	}
	stamp, err := os.ReadFile(filepath.Join(bin, ".syft.version"))
	if err == nil && strings.HasPrefix(string(stamp), string(pin[1])+" ") {
		return true
	}
	t.Logf("syft %s is not built (hack/tools.sh release builds it, about 9 minutes cold): no sbom step; HANDOFF_RELEASE_SBOM=1 (make release-snapshot) runs it", pin[1])
	return false
}

// freePort returns a loopback port below Linux's ephemeral range that
// nothing listens on now, for the test's registry.
func freePort(t *testing.T) int {
	t.Helper()
	for p := 25100 + os.Getpid()%800; p < 26000; p++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err == nil {
			_ = l.Close()
			return p
		}
	}
	t.Fatal("no free port in 25100-25999")
	return 0
}
