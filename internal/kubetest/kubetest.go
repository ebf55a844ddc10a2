// Package kubetest gives tests a real kube-apiserver and etcd
// (controller-runtime envtest), and the demo and benchmarks one of their
// own. The binaries come from KUBEBUILDER_ASSETS or are built and cached by
// hack/kube-assets.sh.
//
// One control plane serves a whole test binary, the shape of
// internal/servertest: the first Get starts it, and Run stops it when the
// tests are over. Tests share it: each makes its own namespace
// (Env.Namespace). Under go test -short the tests that need it are skipped
// (make unit).
//
//	func TestMain(m *testing.M) { kubetest.Run(m) }
//
//	func TestX(t *testing.T) {
//		env := kubetest.Get(t)
//		ns := env.Namespace(t)
//		...
//	}
package kubetest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/handoff-dev/handoff/internal/servertest"
)

// Env is a running control plane.
type Env struct {
	Config *rest.Config
	Client kubernetes.Interface
	// Kubeconfig is the path of a kubeconfig file for the control plane, for
	// subprocesses.
	Kubeconfig string
	// Webhook is where the apiserver sends admission requests for the
	// webhooks installed with WithMutatingWebhooks: serve them on its
	// LocalServingHost and LocalServingPort with the certificate in its
	// LocalServingCertDir.
	Webhook envtest.WebhookInstallOptions

	assets string
}

// Option changes the control plane before it starts, or adds to what
// starts with it (WithSetup).
type Option func(*config)

// config is what the Options make of a start.
type config struct {
	te     *envtest.Environment
	setups []func(*Env) (cleanup func(), err error)
}

// WithMutatingWebhooks installs the webhook configurations, their client
// configs pointed at a local server (see Env.Webhook).
func WithMutatingWebhooks(cfgs ...*admissionregistrationv1.MutatingWebhookConfiguration) Option {
	return func(c *config) {
		c.te.WebhookInstallOptions.MutatingWebhooks = append(c.te.WebhookInstallOptions.MutatingWebhooks, cfgs...)
	}
}

// WithSetup runs setup once the control plane is up, before it is handed
// out, for what the tests need beside it (a webhook server, a controller
// manager); its cleanup runs before the control plane stops. An error fails
// the start.
func WithSetup(setup func(*Env) (cleanup func(), err error)) Option {
	return func(c *config) { c.setups = append(c.setups, setup) }
}

var (
	// server is the one control plane of this test binary; Setup says how
	// it starts.
	server = &servertest.Shared[*Env]{Name: "kube-apiserver and etcd (envtest)"}
	nsSeq  atomic.Int64
)

// Run runs the tests of m and then stops the control plane Get started
// (with opts), if any. Call it from TestMain; when TestMain returns, the
// test binary exits with the code of m.Run.
func Run(m *testing.M, opts ...Option) {
	defer Setup(opts...)()
	m.Run()
}

// Setup is Run for a TestMain that runs the tests itself: it lets Get
// start a control plane (with opts), and returns the func that stops it, to
// run once the tests are over. Call it once, before the tests.
func Setup(opts ...Option) (stop func()) {
	server.Start = func() (*Env, func(), error) { return StartServer(opts...) }
	return server.Setup()
}

// Fuzzing reports whether the test binary runs with -test.fuzz (the
// fuzzing coordinator) or as one of its fuzz workers. Get skips then: a
// fuzz worker process would start a control plane of its own. Call it from
// TestMain or a test: it parses the test flags.
func Fuzzing() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	fuzz, worker := flag.Lookup("test.fuzz"), flag.Lookup("test.fuzzworker")
	return (fuzz != nil && fuzz.Value.String() != "") || (worker != nil && worker.Value.String() == "true")
}

// Get returns the control plane of this test binary, starting it on first
// use (about 3 s once the binaries are built; Run's options apply). Under
// go test -short, or while fuzzing, it skips t. If no control plane can be
// had it fails t (it does not skip).
func Get(t testing.TB) *Env {
	t.Helper()
	if Fuzzing() {
		t.Skip("kubetest: no control plane while fuzzing (-test.fuzz); run the other tests without -fuzz")
	}
	return server.Get(t)
}

// StartServer starts a kube-apiserver and etcd, and what WithSetup options
// add, and returns them with the func that stops them and removes their
// files. It takes about 3 s once the binaries are built. For commands (the
// demo, benchmarks) as well as tests.
func StartServer(opts ...Option) (*Env, func(), error) {
	assets, err := assetsDir()
	if err != nil {
		return nil, nil, err
	}
	c := &config{te: &envtest.Environment{BinaryAssetsDirectory: assets, ControlPlaneStartTimeout: time.Minute}}
	for _, o := range opts {
		o(c)
	}
	te := c.te
	cfg, err := te.Start()
	if err != nil {
		return nil, nil, fmt.Errorf("starting kube-apiserver and etcd: %w", err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	// KUBE_VERSION picks the binaries hack/kube-assets.sh builds (make
	// integration runs the suite once per supported version): a run that
	// asked for one version and got another would pass for the wrong one.
	if want := os.Getenv("KUBE_VERSION"); want != "" {
		v, err := client.Discovery().ServerVersion()
		if err != nil || v.GitVersion != want {
			_ = te.Stop()
			if err != nil {
				return nil, nil, fmt.Errorf("kube-apiserver in %s: its version (want %s, KUBE_VERSION): %w", assets, want, err)
			}
			return nil, nil, fmt.Errorf("kube-apiserver in %s: version %s, want %s (KUBE_VERSION)", assets, v.GitVersion, want)
		}
	}
	dir, err := os.MkdirTemp("", "kubetest")
	if err != nil {
		_ = te.Stop()
		return nil, nil, err
	}
	var cleanups []func()
	stop := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
		_ = te.Stop()
		_ = os.RemoveAll(dir)
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, te.KubeConfig, 0o600); err != nil {
		stop()
		return nil, nil, err
	}
	env := &Env{Config: cfg, Client: client, Kubeconfig: kc, Webhook: te.WebhookInstallOptions, assets: assets}
	for _, setup := range c.setups {
		cleanup, err := setup(env)
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("setup: %w", err)
		}
		cleanups = append(cleanups, cleanup)
	}
	return env, stop, nil
}

// StartControllerManager runs a real kube-controller-manager with only the
// named controllers (e.g. deployment, replicaset) against the control plane,
// and returns the func that stops it. Its binary comes from the assets
// directory, built by hack/kube-assets.sh kube-controller-manager if missing.
func (e *Env) StartControllerManager(controllers ...string) (func(), error) {
	bin := filepath.Join(e.assets, "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		dir, err := assetsDir("kube-controller-manager")
		if err != nil {
			return nil, err
		}
		bin = filepath.Join(dir, "kube-controller-manager")
	}
	cmd := exec.Command(bin, "--kubeconfig="+e.Kubeconfig, "--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false", "--secure-port=0", "--concurrent-deployment-syncs=1", "--concurrent-replicaset-syncs=1")
	log, err := os.CreateTemp("", "kube-controller-manager-*.log")
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting kube-controller-manager: %w", err)
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = log.Close()
		_ = os.Remove(log.Name())
	}, nil
}

// Namespace creates a fresh namespace for one test and returns its name.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d-%d", os.Getpid(), nsSeq.Add(1))
	_, err := e.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// Pod creates a Pod that looks scheduled (spec.nodeName set), so that a
// graceful delete sets metadata.deletionTimestamp and keeps the object, as
// for a pod on a real node. No kubelet runs it.
func (e *Env) Pod(t testing.TB, namespace, name string, gracePeriodSeconds int64) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PodSpec{
			NodeName:                      "node-1",
			TerminationGracePeriodSeconds: &gracePeriodSeconds,
			Containers:                    []corev1.Container{{Name: "worker", Image: "worker"}},
		},
	}
	created, err := e.Client.CoreV1().Pods(namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", namespace, name, err)
	}
	return created
}

// assetsDir is KUBEBUILDER_ASSETS, or the directory hack/kube-assets.sh
// prints (building the binaries on first use, and the extra ones asked for).
func assetsDir(extra ...string) (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" && len(extra) == 0 {
		return d, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(context.Background(), "bash", append([]string{filepath.Join(root, "hack", "kube-assets.sh")}, extra...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/kube-assets.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// WaitFor polls cond every 10 ms until it holds and returns when it did, or
// fails the test after timeout, naming what it waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Now()
}
