package version

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// hack/version.sh, run in a scratch repository through its history: no
// tag, a tag, commits after it, a pre-release tag, a dirty tree, a tag that
// is not a semantic version, and no git at all. Each output that is not an
// error is Released exactly when it is a tag's.
func TestVersionScript(t *testing.T) {
	script, err := os.ReadFile("../hack/version.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "hack"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hack", "version.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t",
			"GIT_COMMITTER_EMAIL=t@example.com", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	version := func() (string, error) {
		cmd := exec.Command("bash", filepath.Join(dir, "hack", "version.sh"))
		cmd.Dir = t.TempDir() // it finds its repository from its own path
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	expect := func(what, want string) {
		t.Helper()
		got, err := version()
		if err != nil || got != want {
			t.Errorf("%s: hack/version.sh = %q, %v; want %q", what, got, err, want)
		}
		if released := !strings.Contains(want, "dev"); Released(got) != released {
			t.Errorf("%s: Released(%q) = %v, want %v", what, got, !released, released)
		}
	}

	expect("no git", "v0.0.0-dev")
	run("git", "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(dir, ".gitignore"), []byte("ignored\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	commit := func(msg string) string {
		t.Helper()
		run("git", "add", "-A")
		run("git", "commit", "-q", "--allow-empty", "-m", msg)
		return run("git", "rev-parse", "--short", "HEAD")
	}
	sha := commit("one")
	expect("no tag", "v0.0.0-dev.1.g"+sha)
	run("git", "tag", "not-a-version")
	expect("a tag not matching v*", "v0.0.0-dev.1.g"+sha)
	run("git", "tag", "-a", "-m", "v0.1.0", "v0.1.0")
	expect("tagged", "v0.1.0")
	if err := os.WriteFile(filepath.Join(dir, "ignored"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect("tagged, an ignored file", "v0.1.0")
	if err := os.WriteFile(filepath.Join(dir, "new"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect("tagged, an untracked file", "v0.1.1-dev.0.g"+sha+".dirty")
	commit("two")
	sha = commit("three")
	expect("two commits after v0.1.0", "v0.1.1-dev.2.g"+sha)
	if err := os.WriteFile(filepath.Join(dir, "new"), []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect("two commits after v0.1.0, changed", "v0.1.1-dev.2.g"+sha+".dirty")
	commit("four")
	run("git", "tag", "v0.2.0-rc.1") // lightweight: as good as annotated
	expect("a pre-release tag", "v0.2.0-rc.1")
	sha = commit("five")
	expect("after a pre-release tag", "v0.2.0-rc.1.dev.1.g"+sha)
	run("git", "tag", "v0.2")
	got, err := version()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(string(exit.Stderr), "tag v0.2: not a semantic version; want vMAJOR.MINOR.PATCH") {
		t.Errorf("nearest tag v0.2: hack/version.sh = %q, %v; want an error naming the tag and the accepted form", got, err)
	}
}
