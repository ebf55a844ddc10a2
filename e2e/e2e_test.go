//go:build e2e

// Package e2e runs handoff where it lives: a real kubelet (e2e/cluster),
// the Helm chart's webhook injecting the example PostgreSQL worker, and
// rollouts driven through the API.
//
//	go test -tags e2e -count=1 -v ./e2e/   (as root; boots and stops its own cluster)
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
)

const (
	hostIP    = "10.89.0.1" // the host on the cluster's pod bridge (e2e/cluster/up.sh)
	pgPort    = "55450"
	namespace = "e2e"
)

var cluster struct {
	kube       kubernetes.Interface
	pool       *pgxpool.Pool
	podDBURL   string // PostgreSQL as the pods reach it
	kubectl    string
	kubeconfig string
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "e2e:", err); return 1 }
	root, err := filepath.Abs("..")
	if err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp("", "handoff-e2e-")
	if err != nil {
		return fail(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := os.Chmod(dir, 0o755); err != nil { // PostgreSQL runs as its own user
		return fail(err)
	}
	runDir := filepath.Join(dir, "cluster")
	sh := func(env []string, name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Stderr = root, os.Stderr
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}

	kubeconfig, err := sh(nil, "bash", "e2e/cluster/up.sh", runDir)
	defer func() { _, _ = sh(nil, "bash", "e2e/cluster/down.sh", runDir) }()
	if err != nil {
		return fail(err)
	}
	cluster.kubeconfig = kubeconfig
	assets, err := sh(nil, "bash", "hack/kube-assets.sh")
	if err != nil {
		return fail(err)
	}
	cluster.kubectl = filepath.Join(assets, "kubectl")

	// Images, written without a container engine and imported into the
	// node's containerd.
	sock := filepath.Join(runDir, "containerd", "containerd.sock")
	for _, img := range []struct{ name, pkg string }{{"handoff", "./cmd/handoff"}, {"pgworker", "./examples/pgworker"}} {
		bin := filepath.Join(dir, img.name)
		tar := bin + ".tar"
		steps := [][]string{
			{"go", "build", "-trimpath", "-o", bin, img.pkg},
			{"go", "run", "./hack/image", "--binary", bin, "--path", "/" + img.name, "--tag", "handoff.local/" + img.name + ":e2e", "--out", tar},
			{"ctr", "--address", sock, "-n", "k8s.io", "images", "import", tar},
		}
		for _, s := range steps {
			if _, err := sh([]string{"CGO_ENABLED=0"}, s[0], s[1:]...); err != nil {
				return fail(err)
			}
		}
	}

	// PostgreSQL on the host, reachable from the pods at the bridge address.
	pgDir := filepath.Join(dir, "pg")
	url, err := sh([]string{"HANDOFF_PG_LISTEN=" + hostIP}, "bash", "hack/postgres.sh", "start", pgDir, pgPort)
	defer func() { _, _ = sh(nil, "bash", "hack/postgres.sh", "stop", pgDir) }()
	if err != nil {
		return fail(err)
	}
	cluster.podDBURL = strings.Replace(url, "127.0.0.1", hostIP, 1)
	ctx := context.Background()
	if cluster.pool, err = pgxpool.New(ctx, url); err != nil {
		return fail(err)
	}
	defer cluster.pool.Close()
	if err := queue.Migrate(ctx, cluster.pool); err != nil {
		return fail(err)
	}

	if _, err := sh([]string{"KUBECONFIG=" + kubeconfig}, cluster.kubectl, "create", "namespace", namespace); err != nil {
		return fail(err)
	}
	// The chart, with the image just imported, its sidecar role bound to the
	// test namespace's default service account.
	tools, err := sh(nil, "bash", "hack/tools.sh")
	if err != nil {
		return fail(err)
	}
	if _, err := sh([]string{"KUBECONFIG=" + kubeconfig}, filepath.Join(tools, "helm"), "install", "handoff", "charts/handoff",
		"--namespace", "handoff", "--create-namespace", "--wait", "--timeout", "2m",
		"--set", "image.repository=handoff.local/handoff", "--set", "image.tag=e2e", "--set", "image.pullPolicy=Never",
		"--set", "webhook.failurePolicy=Fail",
		"--set", "rbac.sidecarBindings[0].namespace="+namespace, "--set", "rbac.sidecarBindings[0].serviceAccount=default"); err != nil {
		return fail(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fail(err)
	}
	cluster.kube = kubernetes.NewForConfigOrDie(cfg)
	if _, err := sh([]string{"KUBECONFIG=" + kubeconfig}, cluster.kubectl, "-n", namespace, "wait", "--for=jsonpath={.metadata.name}=default",
		"serviceaccount/default", "--timeout=30s"); err != nil {
		return fail(err)
	}
	return m.Run()
}
