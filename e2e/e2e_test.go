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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
)

const (
	ownHostIP = "10.89.0.1" // the host on e2e/cluster's pod bridge
	// pgPort is below Linux's ephemeral range (32768-60999): a port in it
	// can be the local end of an outgoing connection at the moment the
	// server binds 127.0.0.1, which then fails (seen once in CI: "accepts
	// connections on its socket but not on 127.0.0.1:55450").
	pgPort    = "25450"
	namespace = "e2e"
	// serviceAccount is the e2e workloads' own service account, bound by
	// the chart to workerLeases.
	serviceAccount = "pgworker"
	// baselineServiceAccount is the baseline's (withoutHandoff), a worker
	// without handoff that holds its Lease itself with client-go: bound by
	// a Role of the test's to workerLeases, not by the chart, whose
	// admission policies let the chart's service accounts name as a
	// Lease's holder only their own pod as the sidecar does (pod name_pod
	// UID), where client-go's identity is host name_random UUID.
	baselineServiceAccount = "pgworker-baseline"
)

// workerLeases are the Leases of every e2e workload (worker's name-leader):
// the chart's Role lets serviceAccount hold these and no other.
var workerLeases = []string{
	"orders-leader", "plain-leader", // TestRolloutRestart
	"delete-grace-6-leader", "legacy-leader", "never-drains-leader", // TestDeadlineHandsBackUnfinishedClaims
	"sigkill-leader", "crash-leader", "twice-leader", "sigterm-leader", "stateful-leader", "evict-leader", // faults_test.go
	"alive-leader",  // TestLivenessKillHandsOverAndRearms
	"soak-leader",   // TestSoak
	"shards-leader", // TestShardRollout, beside its shard set shardLeases
}

var cluster struct {
	kube       kubernetes.Interface
	pool       *pgxpool.Pool
	podDBURL   string // PostgreSQL as the pods reach it
	kubeconfig string
	// ctr is containerd's ctr on the node's socket, in namespace k8s.io:
	// only on our own cluster, whose node is this machine.
	ctr []string
}

// images are the images under test, as the pods name them.
var images = struct {
	handoffRepo, tag, pgworker, riverworker string
	pullPolicy                              corev1.PullPolicy
}{"handoff.local/handoff", "e2e", "handoff.local/pgworker:e2e", "handoff.local/riverworker:e2e", corev1.PullNever}

func TestMain(m *testing.M) {
	var c cleanups
	code := run(m, &c)
	c.run()
	os.Exit(code)
}

func run(m *testing.M, c *cleanups) int {
	flag.Parse()
	c.stopOnInterrupt()
	s, err := newSetup(c)
	if err == nil {
		err = s.cluster()
	}
	if err == nil {
		err = s.images()
	}
	if err == nil {
		err = s.postgres()
	}
	if err == nil {
		err = s.chart()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	return m.Run()
}

// setup brings up what the tests use, registering the undoing of each step
// with its cleanups.
type setup struct {
	c          *cleanups
	root, dir  string // the module root; a temporary directory for the run
	kubeconfig string
	hostIP     string   // this machine as the pods reach it
	load       []string // the command that loads an image tarball into the nodes
	keepDir    bool     // the cluster could not be stopped: down.sh needs its record
}

func newSetup(c *cleanups) (*setup, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "handoff-e2e-")
	if err != nil {
		return nil, err
	}
	s := &setup{c: c, root: root, dir: dir}
	c.add(func() {
		if s.keepDir {
			fmt.Fprintf(os.Stderr, "e2e: kept %s\n", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return s, os.Chmod(dir, 0o755) // PostgreSQL runs as its own user
}

// sh runs a command in the module root, with env added, and returns its
// trimmed stdout; its stderr goes to ours.
func (s *setup) sh(env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Stderr = s.root, os.Stderr
	cmd.Env = append(os.Environ(), env...)
	out, err := s.c.output(cmd)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// cluster boots our own cluster, or takes the one given.
func (s *setup) cluster() error {
	var err error
	s.kubeconfig, s.hostIP = os.Getenv("HANDOFF_E2E_KUBECONFIG"), os.Getenv("HANDOFF_E2E_HOST_IP")
	s.load = strings.Fields(os.Getenv("HANDOFF_E2E_LOAD"))
	if s.kubeconfig == "" {
		runDir := filepath.Join(s.dir, "cluster")
		// Before up.sh: an interruption may stop it halfway. down.sh stops
		// what its record names; while a record is left, the directory is
		// kept for a manual down.sh.
		s.c.add(func() {
			_, err := s.sh(nil, "bash", "e2e/cluster/down.sh", runDir)
			if _, left := os.Stat(filepath.Join(runDir, "pids")); left == nil {
				s.keepDir = true
				fmt.Fprintf(os.Stderr, "e2e: the cluster was not stopped (%v); run e2e/cluster/down.sh %s\n", err, runDir)
			}
		})
		s.kubeconfig, err = s.sh([]string{"HANDOFF_E2E_WATCH_PID=" + strconv.Itoa(os.Getpid())}, "bash", "e2e/cluster/up.sh", runDir)
		if err != nil {
			return err
		}
		s.hostIP = ownHostIP
		cluster.ctr = []string{"ctr", "--address", filepath.Join(runDir, "containerd", "containerd.sock"), "-n", "k8s.io"}
		s.load = append(slices.Clone(cluster.ctr), "images", "import")
	} else if s.hostIP == "" || len(s.load) == 0 {
		return errors.New("HANDOFF_E2E_KUBECONFIG needs HANDOFF_E2E_HOST_IP (this machine's address as the pods reach it, like 172.18.0.1 for kind) and HANDOFF_E2E_LOAD (a command that loads an image tarball, like \"kind load image-archive\")")
	}
	cluster.kubeconfig = s.kubeconfig
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		return err
	}
	if cluster.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	// Which Kubernetes the tests ran on, for the log: the apiserver's and
	// each kubelet's own version (KUBE_VERSION picks them for up.sh).
	v, err := cluster.kube.Discovery().ServerVersion()
	if err != nil {
		return err
	}
	nodes, err := cluster.kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, n := range nodes.Items {
		fmt.Fprintf(os.Stderr, "e2e: kube-apiserver %s, node %s: kubelet %s, %s\n", v.GitVersion, n.Name, n.Status.NodeInfo.KubeletVersion, n.Status.NodeInfo.ContainerRuntimeVersion)
	}
	return nil
}

// images writes the handoff, pgworker and riverworker images without a container
// engine and loads them into the nodes.
func (s *setup) images() error {
	for _, img := range []struct{ name, pkg, ref string }{
		{"handoff", "./cmd/handoff", images.handoffRepo + ":" + images.tag},
		{"pgworker", "./examples/pgworker", images.pgworker},
		{"riverworker", "./examples/riverworker", images.riverworker},
	} {
		bin := filepath.Join(s.dir, img.name)
		tar := bin + ".tar"
		steps := [][]string{
			{"go", "build", "-trimpath", "-o", bin, img.pkg},
			{"go", "run", "./hack/image", "--binary", bin, "--path", "/" + img.name, "--tag", img.ref, "--out", tar},
			append(slices.Clone(s.load), tar),
		}
		if img.name == "handoff" {
			// The sidecar's own build beside it, which injected pods run.
			side := bin + "-sidecar"
			steps = slices.Insert(steps, 1, []string{"go", "build", "-tags", "sidecaronly", "-trimpath", "-o", side, img.pkg})
			steps[2] = append(steps[2], "--sidecar", side)
		}
		for _, step := range steps {
			if _, err := s.sh([]string{"CGO_ENABLED=0"}, step[0], step[1:]...); err != nil {
				return err
			}
		}
	}
	return nil
}

// postgres starts PostgreSQL on this machine, reachable from the pods at
// hostIP; its watchdog stops it should this process be killed.
func (s *setup) postgres() error {
	pgDir := filepath.Join(s.dir, "pg")
	// Before start: an interruption may come after the server is up and
	// before its watchdog is.
	s.c.add(func() { _, _ = s.sh(nil, "bash", "hack/postgres.sh", "stop", pgDir) })
	url, err := s.sh([]string{"HANDOFF_PG_LISTEN=" + s.hostIP, "HANDOFF_PG_WATCH_PID=" + strconv.Itoa(os.Getpid())},
		"bash", "hack/postgres.sh", "start", pgDir, pgPort)
	if err != nil {
		return err
	}
	cluster.podDBURL = strings.Replace(url, "127.0.0.1", s.hostIP, 1)
	if cluster.pool, err = pgxpool.New(context.Background(), url); err != nil {
		return err
	}
	s.c.add(cluster.pool.Close)
	return queue.Migrate(context.Background(), cluster.pool)
}

// chart installs the Helm chart with the images just loaded, its sidecar
// Role bound to the workloads' own service account for their Leases.
func (s *setup) chart() error {
	ctx := context.Background()
	tools, err := s.sh(nil, "bash", "hack/tools.sh")
	if err != nil {
		return err
	}
	helm := func(args ...string) (string, error) {
		return s.sh([]string{"KUBECONFIG=" + s.kubeconfig}, filepath.Join(tools, "helm"), args...)
	}
	_, err = cluster.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s exists, from an earlier run? Remove it and the chart: helm uninstall handoff -n handoff; kubectl delete namespace %s handoff", namespace, namespace)
	}
	if err != nil {
		return err
	}
	if os.Getenv("HANDOFF_E2E_KUBECONFIG") != "" {
		s.c.add(func() { removeNamespaces(helm, namespace, "handoff") })
	}
	_, err = cluster.kube.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccount}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	if err := baselineRBAC(ctx); err != nil {
		return err
	}
	bindings, err := json.Marshal([]map[string]any{{"namespace": namespace, "serviceAccount": serviceAccount, "leases": workerLeases,
		"shards": map[string]any{"prefix": shardPrefix, "count": shardCount}}})
	if err != nil {
		return err
	}
	_, err = helm("install", "handoff", "charts/handoff",
		"--namespace", "handoff", "--create-namespace", "--wait", "--timeout", "2m",
		"--set", "image.repository="+images.handoffRepo, "--set", "image.tag="+images.tag, "--set", "image.pullPolicy="+string(images.pullPolicy),
		"--set", "webhook.failurePolicy=Fail",
		"--set-json", "rbac.sidecarBindings="+string(bindings))
	return err
}

// baselineRBAC creates baselineServiceAccount and lets it hold workerLeases
// (get, create, update: what client-go's leader election sends).
func baselineRBAC(ctx context.Context) error {
	name := baselineServiceAccount
	if _, err := cluster.kube.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := cluster.kube.RbacV1().Roles(namespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: workerLeases, Verbs: []string{"get", "update"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
	}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := cluster.kube.RbacV1().RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}},
	}, metav1.CreateOptions{})
	return err
}
