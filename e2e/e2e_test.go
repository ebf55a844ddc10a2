//go:build e2e

// Package e2e runs handoff where it lives: a real kubelet, the Helm chart's
// webhook injecting the example PostgreSQL worker, and rollouts driven
// through the API.
//
//	go test -tags e2e -count=1 -v ./e2e/   (as root; boots and stops its own cluster with e2e/cluster)
//
// The images and the chart come from an OCI registry, as a user's install
// does: hack/release.sh builds handoff and handoff-sidecar with ko, signs
// them with a key made for the run and verifies them, and pushes the chart
// as an OCI artifact; ko builds the example workers and the pause image on
// the same base. The nodes pull the images by digest and the chart is
// installed with helm install oci://REGISTRY/charts/handoff. On our own
// cluster the registry is Debian's docker-registry on 127.0.0.1:25500
// (hack/registry.sh), which the node's containerd pulls from over plain
// HTTP. The images are built for PLATFORMS (default linux/GOARCH).
//
// Any other cluster whose pods can reach this machine (kind, for one):
//
//	HANDOFF_E2E_KUBECONFIG  its kubeconfig; the cluster is used, not booted
//	HANDOFF_E2E_REGISTRY    a registry this machine pushes to and the nodes
//	                        pull from under the same name, host:port[/path]
//	                        (kind: its local registry, localhost:5001, with
//	                        the hosts.toml that kind's docs give the nodes;
//	                        a 127.0.0.1 or localhost registry is spoken to
//	                        over plain HTTP)
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
	"runtime"
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
	"github.com/handoff-dev/handoff/internal/quickstart"
)

const (
	ownHostIP = "10.89.0.1" // the host on e2e/cluster's pod bridge
	// ownRegistryPort is our own registry's, below Linux's ephemeral range
	// as pgPort is.
	ownRegistryPort = "25500"
	// releaseVersion is the version the images and the chart are built at.
	releaseVersion = "v0.0.0-e2e"
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
	"alive-leader",                               // TestLivenessKillHandsOverAndRearms
	"soak-leader",                                // TestSoak
	"shards-leader",                              // TestShardRollout, beside its shard set shardLeases
	"upgrade-leader",                             // TestUpgradeWithPodsRunning
	"scalein-cost-leader", "scalein-base-leader", // TestScaleInKeepsBusyPods
	"restartall-leader",                                                      // TestRestartAllContainersResumes
	"succ3-leader", "succ3-race-leader", "succ5-leader", "succ5-race-leader", // TestRolloutMovesTheRoleOnce
	"preempt-leader",                            // TestPreemptionHandsOver
	"token-user-leader", "token-fsgroup-leader", // TestTokenFileOnARealKubelet
	"waiting-leader",               // TestRolloutWaitsForTheWebhook
	"nem-a-leader", "nem-b-leader", // TestNemesisShort, TestNemesis
}

var cluster struct {
	kube       kubernetes.Interface
	pool       *pgxpool.Pool
	podDBURL   string // PostgreSQL as the pods reach it
	kubeconfig string
	// ctr is containerd's ctr on the node's socket, in namespace k8s.io:
	// only on our own cluster, whose node is this machine.
	ctr []string
	// kubeletRoot is the kubelet's --root-dir, whose pods' volumes this
	// machine sees: only on our own cluster.
	kubeletRoot string
	// runDir is up.sh's run directory, whose pids file names the cluster's
	// processes (the nemesis pauses and restarts them): only on our own
	// cluster.
	runDir string
}

// images are the images under test, as the pods name them: each
// repository@sha256:digest, pulled from the registry.
var images = struct {
	pgworker, riverworker, pause string
	// netprobe tries HTTP GETs to other pods on request
	// (e2e/cluster/netprobe): what a NetworkPolicy lets through.
	netprobe   string
	pullPolicy corev1.PullPolicy
	// release is the installed release of handoff: its two images and
	// its chart.
	release *release
}{pullPolicy: corev1.PullIfNotPresent}

// release is one release hack/release.sh images chart built, signed and
// pushed to registry: its record (release.env: BASE_IMAGE, CHART,
// CHART_VERSION, CHART_DIGEST, …), its two images as the pods name them
// (repository@sha256:digest), and the public key that verifies its
// signatures.
type release struct {
	registry         string
	record           map[string]string
	handoff, sidecar string
	cosignPub        string
}

// buildRelease builds, signs and pushes the images and the chart of
// version into dist and registry for platforms() with hack/release.sh,
// run by output (with its stderr set to ours), and reads its record.
func buildRelease(output func(*exec.Cmd) ([]byte, error), registry, dist, version string) (*release, error) {
	cmd := exec.Command("bash", "hack/release.sh", "images", "chart")
	cmd.Dir, cmd.Stderr = "..", os.Stderr
	cmd.Env = append(os.Environ(), "REGISTRY="+registry, "PLATFORMS="+platforms(), "DIST="+dist, "VERSION="+version, "SIGN=key", "COSIGN_KEY=")
	if _, err := output(cmd); err != nil {
		return nil, fmt.Errorf("hack/release.sh at %s: %w", version, err)
	}
	data, err := os.ReadFile(filepath.Join(dist, "release.env"))
	if err != nil {
		return nil, err
	}
	r := &release{registry: registry, record: map[string]string{}, cosignPub: filepath.Join(dist, "cosign.pub")}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		r.record[k] = v
	}
	if r.handoff, err = byDigest(r.record["HANDOFF_IMAGE"]); err != nil {
		return nil, fmt.Errorf("release.env HANDOFF_IMAGE: %w", err)
	}
	if r.sidecar, err = byDigest(r.record["HANDOFF_SIDECAR_IMAGE"]); err != nil {
		return nil, fmt.Errorf("release.env HANDOFF_SIDECAR_IMAGE: %w", err)
	}
	return r, nil
}

// imageValues are the chart's values that pull r's images by digest.
func (r *release) imageValues() []string {
	repo, digest, _ := strings.Cut(r.handoff, "@")
	sideRepo, sideDigest, _ := strings.Cut(r.sidecar, "@")
	return []string{"--set", "image.repository=" + repo, "--set", "image.digest=" + digest,
		"--set", "sidecar.image.repository=" + sideRepo, "--set", "sidecar.image.digest=" + sideDigest}
}

// platforms are the platforms the e2e images are built for: PLATFORMS, or
// this machine's.
func platforms() string {
	if p := os.Getenv("PLATFORMS"); p != "" {
		return p
	}
	return "linux/" + runtime.GOARCH
}

func TestMain(m *testing.M) {
	var c cleanups
	code := run(m, &c)
	c.run()
	os.Exit(code)
}

func run(m *testing.M, c *cleanups) int {
	flag.Parse()
	c.stopOnInterrupt()
	c.add(func() {
		if dir := cliDir.Load(); dir != nil {
			_ = os.RemoveAll(*dir)
		}
	})
	s, err := newSetup(c)
	if err == nil {
		err = s.startRegistry()
	}
	if err == nil {
		err = s.images()
	}
	if err == nil {
		err = s.cluster()
	}
	if err == nil {
		err = s.postgres()
	}
	if err == nil {
		err = s.chart()
	}
	if err == nil {
		err = s.startPrometheus()
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
	hostIP     string // this machine as the pods reach it
	registry   string // where the images and the chart are pushed and pulled from
	keepDir    bool   // the cluster could not be stopped: down.sh needs its record
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
		s.kubeconfig, err = s.sh([]string{"HANDOFF_E2E_WATCH_PID=" + strconv.Itoa(os.Getpid()),
			"HANDOFF_E2E_REGISTRY=" + s.registry, "HANDOFF_E2E_PAUSE_IMAGE=" + images.pause}, "bash", "e2e/cluster/up.sh", runDir)
		if err != nil {
			return err
		}
		s.hostIP = ownHostIP
		cluster.ctr = []string{"ctr", "--address", filepath.Join(runDir, "containerd", "containerd.sock"), "-n", "k8s.io"}
		cluster.kubeletRoot = filepath.Join(runDir, "kubelet", "root")
		cluster.runDir = runDir
	} else if s.hostIP == "" {
		return errors.New("HANDOFF_E2E_KUBECONFIG needs HANDOFF_E2E_HOST_IP (this machine's address as the pods reach it, like 172.18.0.1 for kind)")
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

// startRegistry starts our own loopback registry, or takes HANDOFF_E2E_REGISTRY
// (needed with HANDOFF_E2E_KUBECONFIG: the given cluster's nodes must
// reach it); its watchdog stops ours should this process be killed.
func (s *setup) startRegistry() error {
	if os.Getenv("HANDOFF_E2E_KUBECONFIG") != "" {
		s.registry = strings.TrimSuffix(os.Getenv("HANDOFF_E2E_REGISTRY"), "/")
		if s.registry == "" {
			return errors.New("HANDOFF_E2E_KUBECONFIG needs HANDOFF_E2E_REGISTRY: a registry this machine pushes to and the nodes pull from under the same name (kind: its local registry, localhost:5001)")
		}
		return nil
	}
	dir := filepath.Join(s.dir, "registry")
	s.c.add(func() { _, _ = s.sh(nil, "bash", "hack/registry.sh", "stop", dir) })
	var err error
	s.registry, err = s.sh([]string{"HANDOFF_WATCH_PID=" + strconv.Itoa(os.Getpid())}, "bash", "hack/registry.sh", "start", dir, ownRegistryPort)
	return err
}

// images builds and pushes the images and the chart: handoff,
// handoff-sidecar and the chart with hack/release.sh (signed and
// verified), the example workers and the pause image with ko on the
// release's base image.
func (s *setup) images() error {
	var err error
	if images.release, err = buildRelease(s.c.output, s.registry, filepath.Join(s.dir, "dist"), releaseVersion); err != nil {
		return err
	}
	tools, err := s.sh(nil, "bash", "hack/tools.sh")
	if err != nil {
		return err
	}
	// -B: each image is REGISTRY/e2e/<the package's last element>.
	pkgs := map[string]*string{"./examples/pgworker": &images.pgworker, "./examples/riverworker": &images.riverworker, "./e2e/cluster/pause": &images.pause,
		"./e2e/cluster/netprobe": &images.netprobe}
	args := []string{"build", "-B", "--tags", "e2e", "--platform", platforms(), "--sbom", "none"}
	for pkg := range pkgs {
		args = append(args, pkg)
	}
	out, err := s.sh([]string{"KO_DOCKER_REPO=" + s.registry + "/e2e", "KO_DEFAULTBASEIMAGE=" + images.release.record["BASE_IMAGE"]},
		filepath.Join(tools, "ko"), args...)
	if err != nil {
		return err
	}
	for pkg, dst := range pkgs {
		for _, ref := range strings.Fields(out) {
			if strings.HasPrefix(ref, s.registry+"/e2e/"+filepath.Base(pkg)+":") {
				if *dst, err = byDigest(ref); err != nil {
					return fmt.Errorf("ko build %s: %w", pkg, err)
				}
			}
		}
		if *dst == "" {
			return fmt.Errorf("ko build printed %q: no image of %s", out, pkg)
		}
	}
	return nil
}

// plainHTTP says whether registry (host[:port][/path]) is on loopback, 127.0.0.1
// or localhost, where it is spoken to over plain HTTP, as hack/release.sh
// does.
func plainHTTP(registry string) bool {
	host, _, _ := strings.Cut(registry, "/")
	host, _, _ = strings.Cut(host, ":")
	return host == "127.0.0.1" || host == "localhost"
}

// byDigest turns repository:tag@sha256:digest (what ko prints) into
// repository@sha256:digest: the pods name the images by digest alone.
func byDigest(ref string) (string, error) {
	repoTag, digest, ok := strings.Cut(ref, "@sha256:")
	if !ok || len(digest) != 64 {
		return "", fmt.Errorf("%q is not an image reference by sha256 digest", ref)
	}
	if i := strings.LastIndex(repoTag, ":"); i > strings.LastIndex(repoTag, "/") {
		repoTag = repoTag[:i]
	}
	return repoTag + "@sha256:" + digest, nil
}

// postgres starts PostgreSQL on this machine, reachable from the pods at
// hostIP; its watchdog stops it should this process be killed.
func (s *setup) postgres() error {
	pgDir := filepath.Join(s.dir, "pg")
	// Before start: an interruption may come after the server is up and
	// before its watchdog is.
	s.c.add(func() { _, _ = s.sh(nil, "bash", "hack/postgres.sh", "stop", pgDir) })
	url, err := s.sh([]string{"HANDOFF_PG_LISTEN=" + s.hostIP, "HANDOFF_WATCH_PID=" + strconv.Itoa(os.Getpid())},
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

// chart installs the Helm chart from the registry with the README's own
// command: the quickstart's `helm install handoff …` (internal/quickstart),
// its HANDOFF_CHARTS and HANDOFF_VERSION set to the release built here,
// then the e2e's flags appended: --plain-http for a loopback registry, the
// images by digest, failurePolicy Fail, and its sidecar Role bound to the
// workloads' own service account for their Leases. TestQuickstart runs the
// rest of the quickstart.
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
	args, err := readmeInstall(s.root)
	if err != nil {
		return err
	}
	if plainHTTP(s.registry) {
		args = append(args, "--plain-http")
	}
	// 5m: on two cores shared with builds (load 15-20) the webhook's pods
	// took more than 2m to be ready, twice on 2026-12-07; alone, seconds.
	args = append(args, "--timeout", "5m")
	args = append(args, images.release.imageValues()...)
	_, err = helm(append(args,
		"--set", "webhook.failurePolicy=Fail",
		"--set-json", "rbac.sidecarBindings="+string(bindings))...)
	if err != nil {
		logChartPods(ctx)
	}
	return err
}

// logChartPods logs the chart's pods and the namespace's Events: why an
// install that waits for them did not finish.
func logChartPods(ctx context.Context) {
	pods, err := cluster.kube.CoreV1().Pods("handoff").List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: the chart's pods:", err)
		return
	}
	for _, p := range pods.Items {
		var cs []string
		for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			st := "running"
			switch {
			case s.State.Waiting != nil:
				st = "waiting: " + s.State.Waiting.Reason + " " + s.State.Waiting.Message
			case s.State.Terminated != nil:
				st = "terminated: " + s.State.Terminated.Reason
			}
			cs = append(cs, fmt.Sprintf("%s ready=%t restarts=%d %s", s.Name, s.Ready, s.RestartCount, st))
		}
		fmt.Fprintf(os.Stderr, "e2e: chart pod %s: %s; %s\n", p.Name, p.Status.Phase, strings.Join(cs, "; "))
	}
	events, err := cluster.kube.CoreV1().Events("handoff").List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(os.Stderr, "e2e: event %s %s %s: %s\n", e.LastTimestamp.Format("15:04:05"), e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
}

// readmeInstall is the README quickstart's platform install, as bash
// expands it with HANDOFF_CHARTS and HANDOFF_VERSION naming the release
// built here: the words after helm. It must install that release's chart
// as release handoff in namespace handoff, as the tests and their cleanup
// expect.
func readmeInstall(root string) ([]string, error) {
	q, err := quickstart.Read(filepath.Join(root, "README.md"))
	if err != nil {
		return nil, fmt.Errorf("README.md: %w", err)
	}
	chart := images.release.record["CHART"]
	args, err := q.PlatformInstallArgs(context.Background(), []string{
		"HANDOFF_CHARTS=" + strings.TrimSuffix(chart, "/handoff"), "HANDOFF_VERSION=" + images.release.record["CHART_VERSION"]})
	if err != nil {
		return nil, fmt.Errorf("README.md: %w", err)
	}
	ns := slices.Index(args, "--namespace")
	if len(args) < 3 || args[2] != chart || ns < 0 || ns+1 >= len(args) || args[ns+1] != "handoff" {
		return nil, fmt.Errorf("README.md: the quickstart's platform install is helm %q; want helm install handoff %s … --namespace handoff (the release the tests use)", args, chart)
	}
	return args, nil
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
