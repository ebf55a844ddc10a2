package modgraph_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
)

// releaseVersion is the version the test releases its copy of the
// repository at (in a module cache of its own: nothing outside the test
// sees it): a pre-release of v0.1.0, another each run, because the go
// command takes a module version's sources as fixed and reuses what it
// compiled of them from its build cache, which is shared: a second run
// releasing other sources as the same version linked the first run's
// packages (a CI run on 2026-12-07 failed so, files missing that a later
// commit had removed).
var releaseVersion = fmt.Sprintf("v0.1.0-test.%d", time.Now().UnixNano())

// A release, as docs/releasing.md makes one: hack/release-modules.sh on a
// clone of this working tree commits every module's requirements at the
// release's version and tags every module. Served from those tags by a
// module proxy on disk (GOPROXY=file://, go run ./hack/modrelease proxy),
// ahead of the usual proxy for every other module, outside any workspace
// (GOWORK=off) and with no replace anywhere:
//   - go install github.com/handoff-dev/handoff/cmd/handoff@VERSION (and
//     cmd/handoff-sidecar) resolves and builds, the binaries say VERSION
//     and were built from the tagged modules;
//   - a scratch module outside the repository that requires only
//     github.com/handoff-dev/handoff/worker@VERSION gets protocol at
//     VERSION through it (go mod tidy), with no replace, and builds a tiny
//     worker.
//
// Slow (a build of both binaries from a module cache of their own, with
// the build cache shared): skipped under -short.
func TestATaggedReleaseInstallsThroughAModuleProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries from a release made in a copy of the repository; not under -short")
	}
	r, tmp := root(t), t.TempDir()
	if _, err := exec.Command("git", "-C", r, "rev-parse", "HEAD").Output(); err != nil {
		t.Skipf("%s is not a git repository with a commit (%v): nothing to tag", r, err)
	}
	// git for the copy: no user or system configuration, a fixed identity.
	gitEnv := append(os.Environ(), "GIT_CONFIG_GLOBAL="+os.DevNull, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=handoff test", "GIT_AUTHOR_EMAIL=test@handoff.invalid",
		"GIT_COMMITTER_NAME=handoff test", "GIT_COMMITTER_EMAIL=test@handoff.invalid")
	run := func(dir string, env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dir, env
		start := time.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out)
		}
		if d := time.Since(start); d > time.Second {
			t.Logf("%s %s: %.1f s", name, strings.Join(args, " "), d.Seconds())
		}
		return string(out)
	}

	// The clone holds this working tree as one more commit: what is
	// tested is what would be committed (git's tracked and not ignored
	// files), as go.mod files, scripts and all.
	clone := filepath.Join(tmp, "repo")
	run(tmp, gitEnv, "git", "clone", "-q", r, clone)
	run(clone, gitEnv, "git", "--work-tree="+r, "add", "-A")
	run(clone, gitEnv, "git", "commit", "-q", "--allow-empty", "-m", "the working tree under test")
	run(clone, gitEnv, "git", "reset", "-q", "--hard")

	run(clone, gitEnv, "bash", "hack/release-modules.sh", releaseVersion)
	tags := strings.Fields(run(clone, gitEnv, "git", "tag", "--points-at", "HEAD"))
	for _, dir := range append([]string{""}, modules...) {
		tag := releaseVersion
		if dir != "" {
			tag = dir + "/" + releaseVersion
		}
		if !slices.Contains(tags, tag) {
			t.Errorf("the release commit has no tag %s (tags there: %v)", tag, tags)
		}
	}
	// What the release workflow checks before it publishes.
	run(clone, gitEnv, "go", "run", "./hack/modrelease", "tagged", releaseVersion)
	proxyDir := filepath.Join(tmp, "proxy")
	run(clone, gitEnv, "go", "run", "./hack/modrelease", "proxy", "-out", proxyDir, "-repo", clone, releaseVersion)

	// A user's go command: no workspace, the tags from the proxy on disk,
	// every other module from the module cache's downloads or the usual
	// proxy, into a module cache of the test's own (so the release made
	// here never reaches the real one), kept between runs without the
	// repository's modules. Not in the checksum database (GONOSUMDB): the
	// go.sum files carry the release's hashes.
	goproxy := strings.TrimSpace(run(r, os.Environ(), "go", "env", "GOPROXY"))
	cache := strings.TrimSpace(run(r, os.Environ(), "go", "env", "GOMODCACHE"))
	userEnv := append(os.Environ(),
		"GOWORK=off",
		"GOPROXY=file://"+filepath.ToSlash(proxyDir)+",file://"+filepath.ToSlash(filepath.Join(cache, "cache", "download"))+","+goproxy,
		"GONOSUMDB="+repo, "GONOPROXY=none", "GOPRIVATE=",
		"GOMODCACHE="+releaseModCache(t),
		// -modcacherw: the repository's modules can be removed from the
		// cache. -trimpath and no cgo, as make build: the packages
		// compiled are the ones the build cache holds already, whatever
		// the module cache's path.
		"GOFLAGS=-modcacherw -trimpath", "CGO_ENABLED=0",
		"GOBIN="+filepath.Join(tmp, "bin"))

	run(tmp, userEnv, "go", "install", repo+"/cmd/handoff@"+releaseVersion, repo+"/cmd/handoff-sidecar@"+releaseVersion)
	for _, bin := range []string{"handoff", "handoff-sidecar"} {
		info := run(tmp, userEnv, "go", "version", "-m", filepath.Join(tmp, "bin", bin))
		for _, want := range []string{"mod\t" + repo + "\t" + releaseVersion, "dep\t" + repo + "/protocol\t" + releaseVersion} {
			if !strings.Contains(info, want+"\t") {
				t.Errorf("%s's build information has no line %q:\n%s", bin, want, info)
			}
		}
		if strings.Contains(info, "=>") {
			t.Errorf("%s was built with a module replaced:\n%s", bin, info)
		}
	}
	var v struct{ Client struct{ Version string } }
	if err := json.Unmarshal([]byte(run(tmp, userEnv, filepath.Join(tmp, "bin", "handoff"), "version", "--client", "-o", "json")), &v); err != nil {
		t.Fatal(err)
	}
	if v.Client.Version != releaseVersion {
		t.Errorf("handoff version --client says %q, want %s (the module version go install built)", v.Client.Version, releaseVersion)
	}

	app := filepath.Join(tmp, "app") // outside the clone: no go.work
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"go.mod": "module example.com/scratchworker\n\ngo 1.24\n",
		"main.go": `// A tiny worker: serves the handoff sidecar's calls, claims nothing, and
// exits once drained.
package main

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"` + repo + `/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	agent, err := worker.New(worker.Options{})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := agent.ListenAndServe(ctx, "127.0.0.1:8484"); err != nil {
			log.Print(err)
		}
	}()
	<-agent.Stopping()
	if err := agent.WaitDrained(context.Background()); err != nil {
		log.Fatal(err)
	}
}
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(app, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(app, userEnv, "go", "get", repo+"/worker@"+releaseVersion)
	run(app, userEnv, "go", "mod", "tidy")
	run(app, userEnv, "go", "build", "-o", filepath.Join(tmp, "bin", "scratchworker"), ".")
	data, err := os.ReadFile(filepath.Join(app, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Replace) > 0 {
		t.Errorf("the scratch module's go.mod has a replace:\n%s", data)
	}
	got := map[string]string{}
	for _, req := range f.Require {
		got[req.Mod.Path] = req.Mod.Version
	}
	for _, m := range []string{repo + "/worker", repo + "/protocol"} {
		if got[m] != releaseVersion {
			t.Errorf("the scratch module requires %s at %q, want %s:\n%s", m, got[m], releaseVersion, data)
		}
	}
}

// releaseModCache returns the module cache the release test's go commands
// use: $HANDOFF_CACHE/release-modcache (default ~/.cache/handoff), kept
// between runs (what the modules other than the repository's unpack to),
// held by this test alone until it ends (a lock), and without any version
// of the repository's own modules, before and after the test.
func releaseModCache(t *testing.T) string {
	t.Helper()
	base := os.Getenv("HANDOFF_CACHE")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		base = filepath.Join(home, ".cache", "handoff")
	}
	dir := filepath.Join(base, "release-modcache")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(base, "release-modcache.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	purge := func() {
		// The module's own directories and downloads; the go command made
		// them writable (-modcacherw).
		for _, p := range []string{filepath.Join(dir, "github.com", "handoff-dev"), filepath.Join(dir, "cache", "download", "github.com", "handoff-dev")} {
			if err := os.RemoveAll(p); err != nil {
				t.Errorf("the release test's module cache: %v", err)
			}
		}
	}
	purge()
	t.Cleanup(func() {
		purge()
		_ = lock.Close() // and the lock with it
	})
	return dir
}

// Inside the repository the go command builds the local trees of all the
// repository's modules (go.work), whatever version the go.mod files require
// each other at: every one of them resolves to its directory, with no
// version, and no other version of one is in the build list.
func TestTheWorkspaceUsesTheLocalTrees(t *testing.T) {
	r := root(t)
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Path}} {{.Version}} {{.Dir}}", "all")
	cmd.Dir = r
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(r, "go.work"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	want := map[string]string{repo: r}
	for _, dir := range modules {
		want[repo+"/"+dir] = filepath.Join(r, filepath.FromSlash(dir))
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		dir, ours := want[f[0]]
		if !ours {
			continue
		}
		delete(want, f[0])
		if len(f) != 2 || f[1] != dir {
			t.Errorf("go list -m all in the workspace: %q, want %s at its directory %s", line, f[0], dir)
		}
	}
	for m := range want {
		t.Errorf("go list -m all in the workspace lists no %s", m)
	}
}
