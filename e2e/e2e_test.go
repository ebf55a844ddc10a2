//go:build e2e

// Package e2e runs handoff where it lives: a real kubelet, the Helm chart's
// webhook injecting the example PostgreSQL worker, and rollouts driven
// through the API.
//
//	go test -tags e2e -count=1 -v ./e2e/   (as root; boots and stops its own cluster with e2e/cluster)
//
// Any other cluster whose pods can reach this machine (kind, for one):
//
//	HANDOFF_E2E_KUBECONFIG  its kubeconfig; the cluster is used, not booted
//	HANDOFF_E2E_LOAD        command that loads an image tarball, given as its
//	                        last argument, into the nodes: "kind load image-archive"
//	HANDOFF_E2E_HOST_IP     this machine's address as the pods reach it, where
//	                        the tests' PostgreSQL listens (kind: the gateway of
//	                        the docker network "kind")
//
// The tests install the chart as release handoff in namespace handoff and
// work in namespace e2e; on such a cluster they remove both at the end.
package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
)

const (
	ownHostIP = "10.89.0.1" // the host on e2e/cluster's pod bridge
	pgPort    = "55450"
	namespace = "e2e"
)

var cluster struct {
	kube     kubernetes.Interface
	pool     *pgxpool.Pool
	podDBURL string // PostgreSQL as the pods reach it
}

// images are the images under test, as the pods name them.
var images = struct {
	handoffRepo, tag, pgworker string
	pullPolicy                 corev1.PullPolicy
}{"handoff.local/handoff", "e2e", "handoff.local/pgworker:e2e", corev1.PullNever}

func TestMain(m *testing.M) {
	var c cleanups
	code := run(m, &c)
	c.run()
	os.Exit(code)
}

func run(m *testing.M, c *cleanups) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "e2e:", err); return 1 }
	flag.Parse()
	c.stopOnInterrupt()
	root, err := filepath.Abs("..")
	if err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp("", "handoff-e2e-")
	if err != nil {
		return fail(err)
	}
	var keepDir bool // when the cluster could not be stopped: down.sh needs its record
	c.add(func() {
		if keepDir {
			fmt.Fprintf(os.Stderr, "e2e: kept %s\n", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	if err := os.Chmod(dir, 0o755); err != nil { // PostgreSQL runs as its own user
		return fail(err)
	}
	sh := func(env []string, name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Stderr = root, os.Stderr
		cmd.Env = append(os.Environ(), env...)
		out, err := c.output(cmd)
		if err != nil {
			return "", fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}

	// The cluster: the one given, or our own.
	kubeconfig, hostIP := os.Getenv("HANDOFF_E2E_KUBECONFIG"), os.Getenv("HANDOFF_E2E_HOST_IP")
	load := strings.Fields(os.Getenv("HANDOFF_E2E_LOAD"))
	if kubeconfig == "" {
		runDir := filepath.Join(dir, "cluster")
		kubeconfig, err = sh([]string{"HANDOFF_E2E_WATCH_PID=" + strconv.Itoa(os.Getpid())}, "bash", "e2e/cluster/up.sh", runDir)
		c.add(func() {
			if _, err := sh(nil, "bash", "e2e/cluster/down.sh", runDir); err != nil {
				keepDir = true
				fmt.Fprintf(os.Stderr, "e2e: %v; run e2e/cluster/down.sh %s\n", err, runDir)
			}
		})
		if err != nil {
			return fail(err)
		}
		hostIP = ownHostIP
		load = []string{"ctr", "--address", filepath.Join(runDir, "containerd", "containerd.sock"), "-n", "k8s.io", "images", "import"}
	} else if hostIP == "" || len(load) == 0 {
		return fail(errors.New("HANDOFF_E2E_KUBECONFIG needs HANDOFF_E2E_HOST_IP (this machine's address as the pods reach it, like 172.18.0.1 for kind) and HANDOFF_E2E_LOAD (a command that loads an image tarball, like \"kind load image-archive\")"))
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fail(err)
	}
	cluster.kube = kubernetes.NewForConfigOrDie(cfg)

	// Images, written without a container engine and loaded into the nodes.
	for _, img := range []struct{ name, pkg, ref string }{
		{"handoff", "./cmd/handoff", images.handoffRepo + ":" + images.tag},
		{"pgworker", "./examples/pgworker", images.pgworker},
	} {
		bin := filepath.Join(dir, img.name)
		tar := bin + ".tar"
		steps := [][]string{
			{"go", "build", "-trimpath", "-o", bin, img.pkg},
			{"go", "run", "./hack/image", "--binary", bin, "--path", "/" + img.name, "--tag", img.ref, "--out", tar},
			append(load[:len(load):len(load)], tar),
		}
		for _, s := range steps {
			if _, err := sh([]string{"CGO_ENABLED=0"}, s[0], s[1:]...); err != nil {
				return fail(err)
			}
		}
	}

	// PostgreSQL on this machine, reachable from the pods at hostIP.
	pgDir := filepath.Join(dir, "pg")
	// Its watchdog stops it should this process be killed.
	url, err := sh([]string{"HANDOFF_PG_LISTEN=" + hostIP, "HANDOFF_PG_WATCH_PID=" + strconv.Itoa(os.Getpid())},
		"bash", "hack/postgres.sh", "start", pgDir, pgPort)
	c.add(func() { _, _ = sh(nil, "bash", "hack/postgres.sh", "stop", pgDir) })
	if err != nil {
		return fail(err)
	}
	cluster.podDBURL = strings.Replace(url, "127.0.0.1", hostIP, 1)
	ctx := context.Background()
	if cluster.pool, err = pgxpool.New(ctx, url); err != nil {
		return fail(err)
	}
	c.add(cluster.pool.Close)
	if err := queue.Migrate(ctx, cluster.pool); err != nil {
		return fail(err)
	}

	// The chart, with the images just loaded, its sidecar role bound to the
	// test namespace's default service account.
	tools, err := sh(nil, "bash", "hack/tools.sh")
	if err != nil {
		return fail(err)
	}
	helm := func(args ...string) (string, error) {
		return sh([]string{"KUBECONFIG=" + kubeconfig}, filepath.Join(tools, "helm"), args...)
	}
	_, err = cluster.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return fail(fmt.Errorf("namespace %s exists, from an earlier run? Remove it and the chart: helm uninstall handoff -n handoff; kubectl delete namespace %s handoff", namespace, namespace))
	}
	if err != nil {
		return fail(err)
	}
	if os.Getenv("HANDOFF_E2E_KUBECONFIG") != "" {
		c.add(func() { removeNamespaces(helm, namespace, "handoff") })
	}
	if _, err := helm("install", "handoff", "charts/handoff",
		"--namespace", "handoff", "--create-namespace", "--wait", "--timeout", "2m",
		"--set", "image.repository="+images.handoffRepo, "--set", "image.tag="+images.tag, "--set", "image.pullPolicy="+string(images.pullPolicy),
		"--set", "webhook.failurePolicy=Fail",
		"--set", "rbac.sidecarBindings[0].namespace="+namespace, "--set", "rbac.sidecarBindings[0].serviceAccount=default"); err != nil {
		return fail(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := cluster.kube.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			break
		} else if time.Now().After(deadline) {
			return fail(fmt.Errorf("service account %s/default: %w", namespace, err))
		}
	}
	return m.Run()
}
