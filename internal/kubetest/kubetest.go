// Package kubetest starts a real kube-apiserver and etcd (controller-runtime
// envtest) for the integration tests of one test binary, and for the demo. The binaries come
// from KUBEBUILDER_ASSETS or are built and cached by hack/kube-assets.sh.
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

// Option changes the control plane before it starts.
type Option func(*envtest.Environment)

// WithMutatingWebhooks installs the webhook configurations, their client
// configs pointed at a local server (see Env.Webhook).
func WithMutatingWebhooks(cfgs ...*admissionregistrationv1.MutatingWebhookConfiguration) Option {
	return func(te *envtest.Environment) {
		te.WebhookInstallOptions.MutatingWebhooks = append(te.WebhookInstallOptions.MutatingWebhooks, cfgs...)
	}
}

var (
	current *Env
	nsSeq   atomic.Int64
)

// Main starts the control plane, runs the tests, stops it, and exits with
// the tests' code. Call it from TestMain.
func Main(m *testing.M, opts ...Option) {
	MainWith(m, nil, opts...)
}

// MainWith is Main with setup run once the control plane is up and before
// the tests, for servers the tests need; its cleanup runs after them.
func MainWith(m *testing.M, setup func(*Env) (cleanup func(), err error), opts ...Option) {
	os.Exit(run(m, setup, opts))
}

func run(m *testing.M, setup func(*Env) (func(), error), opts []Option) int {
	if Fuzzing() {
		// The fuzz targets need no control plane, and every fuzz worker
		// process runs TestMain again: starting one each would cost seconds
		// per worker and an apiserver per core.
		return m.Run()
	}
	env, stop, err := Start(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubetest:", err)
		return 1
	}
	defer stop()
	if setup != nil {
		cleanup, err := setup(env)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kubetest setup:", err)
			return 1
		}
		defer cleanup()
	}
	current = env
	return m.Run()
}

// Fuzzing reports whether the test binary runs with -test.fuzz (the
// fuzzing coordinator) or as one of its fuzz workers. Main starts no control
// plane then. Call it from TestMain or a test: it parses the test flags.
func Fuzzing() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	fuzz, worker := flag.Lookup("test.fuzz"), flag.Lookup("test.fuzzworker")
	return (fuzz != nil && fuzz.Value.String() != "") || (worker != nil && worker.Value.String() == "true")
}

// Start starts a kube-apiserver and etcd and returns them with the func
// that stops them and removes their files. It takes about 3 s once the
// binaries are built.
func Start(opts ...Option) (*Env, func(), error) {
	assets, err := assetsDir()
	if err != nil {
		return nil, nil, err
	}
	te := &envtest.Environment{BinaryAssetsDirectory: assets, ControlPlaneStartTimeout: time.Minute}
	for _, o := range opts {
		o(te)
	}
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
	stop := func() { _ = te.Stop(); _ = os.RemoveAll(dir) }
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, te.KubeConfig, 0o600); err != nil {
		stop()
		return nil, nil, err
	}
	return &Env{Config: cfg, Client: client, Kubeconfig: kc,
		Webhook: te.WebhookInstallOptions, assets: assets}, stop, nil
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

// Get returns the control plane started by Main.
func Get(t testing.TB) *Env {
	t.Helper()
	if current == nil && Fuzzing() {
		t.Skip("kubetest: no control plane while fuzzing (-test.fuzz); run the other tests without -fuzz")
	}
	if current == nil {
		t.Fatal("kubetest: no control plane: call kubetest.Main from TestMain")
	}
	return current
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
