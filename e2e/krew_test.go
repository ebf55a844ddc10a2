//go:build e2e

package e2e

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestKrewInstallsTheKubectlPlugin: hack/krew.sh packs the CLI as a krew
// plugin (archives and the manifest, as hack/release.sh binaries does for
// a release), served here over HTTP in place of the GitHub release; krew's
// own validate-krew-manifest accepts the manifest and installs every
// platform of it (each archive holds the repository's LICENSE), and `kubectl
// krew install` installs it, after which the real kubectl runs `kubectl
// handoff status` on the e2e cluster.
func TestKrewInstallsTheKubectlPlugin(t *testing.T) {
	tools, err := exec.Command("bash", "../hack/tools.sh").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := strings.TrimSpace(string(tools))
	kubectlDir, err := exec.Command("bash", "../hack/kube-assets.sh", "kubectl").Output()
	if err != nil {
		t.Fatalf("hack/kube-assets.sh kubectl: %v", err)
	}
	dist := t.TempDir()
	cli, err := os.ReadFile(mustCLI(t))
	if err != nil {
		t.Fatal(err)
	}
	// This machine's platform, and one more (krew installs each; only this
	// one runs).
	for _, p := range []string{runtime.GOOS + "-" + runtime.GOARCH, "darwin-arm64"} {
		if err := os.WriteFile(filepath.Join(dist, "handoff-"+p), cli, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(dist)))
	defer srv.Close()
	if out, err := exec.Command("bash", "../hack/krew.sh", dist, releaseVersion, srv.URL).CombinedOutput(); err != nil {
		t.Fatalf("hack/krew.sh: %v\n%s", err, out)
	}
	manifest := filepath.Join(dist, "handoff.yaml")

	// kubectl finds plugins on PATH as kubectl-NAME: krew itself, and what
	// it installs under KREW_ROOT/bin.
	pathDir, root := t.TempDir(), t.TempDir()
	if err := os.Symlink(filepath.Join(bin, "krew"), filepath.Join(pathDir, "kubectl-krew")); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "KREW_ROOT="+root,
		"PATH="+strings.Join([]string{filepath.Join(root, "bin"), pathDir, strings.TrimSpace(string(kubectlDir)), os.Getenv("PATH")}, string(os.PathListSeparator)))
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// krew's validator also installs each platform, and refuses an archive
	// without a license file, which the krew index requires (hack/krew.sh
	// packs the repository's LICENSE).
	run(filepath.Join(bin, "validate-krew-manifest"), "-manifest", manifest)
	run("kubectl", "krew", "install", "--manifest", manifest)
	if out := run("kubectl", "plugin", "list"); !strings.Contains(out, "kubectl-handoff") {
		t.Errorf("kubectl plugin list has no kubectl-handoff:\n%s", out)
	}
	out := run("kubectl", "handoff", "status", "--kubeconfig", cluster.kubeconfig, "-n", namespace)
	if !strings.Contains(out, "Namespace "+namespace) {
		t.Errorf("kubectl handoff status:\n%s\nwant the namespace's view", out)
	}
	t.Logf("kubectl krew install --manifest handoff.yaml, then kubectl handoff status:\n%s", out)
}
