package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/cli/clitest"
	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/kube"
	"github.com/handoff-dev/handoff/internal/cli/version"
	"github.com/handoff-dev/handoff/internal/cli/version/client"
	"github.com/handoff-dev/handoff/internal/kubetest"
	hversion "github.com/handoff-dev/handoff/version"
)

// runVersion runs `handoff version args...` in this process; it fails the
// test if the command fails.
func runVersionCommand(t *testing.T, args ...string) string {
	t.Helper()
	return runCommand(t, version.Command, args...)
}

// run runs c with args in this process and returns what it wrote; it
// fails the test if the command fails.
func runCommand(t *testing.T, c command.Command, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := command.Execute(context.Background(), c, args, nil, &out, &out); err != nil {
		t.Fatalf("handoff %s %s: %v\n%s", c.Name(), strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func versionJSON(t *testing.T, args ...string) client.Report {
	t.Helper()
	out := runVersionCommand(t, append(args, "-o", "json")...)
	var r client.Report
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("handoff version -o json: %v\n%s", err, out)
	}
	return r
}

// On the real apiserver: the webhook's pods counted by their version label,
// else their image tag, else unknown; the injected pods by their
// handoff.dev/version annotation, unknown without one, leaving out pods
// not injected and pods that have finished; in one namespace or all;
// newest first; and the Kubernetes version.
func TestVersionCommandReadsTheCluster(t *testing.T) {
	env := kubetest.Get(t)
	ns, other, hooks := env.Namespace(t), env.Namespace(t), env.Namespace(t)
	chartLabels := func(v string) map[string]string {
		l := map[string]string{"app.kubernetes.io/name": "handoff", "app.kubernetes.io/part-of": "handoff", "app.kubernetes.io/component": "webhook", "app.kubernetes.io/instance": "handoff"}
		if v != "" {
			l["app.kubernetes.io/version"] = v
		}
		return l
	}
	clitest.CreatePod(t, env, hooks, "labelled", "ghcr.io/handoff-dev/handoff:v0.9.0", chartLabels("v0.10.0"), nil, "")
	clitest.CreatePod(t, env, hooks, "tagged", "registry.local:5000/handoff-dev/handoff:v0.9.0@sha256:"+strings.Repeat("a", 64), chartLabels(""), nil, "")
	clitest.CreatePod(t, env, hooks, "digest", "registry.local:5000/handoff-dev/handoff@sha256:"+strings.Repeat("b", 64), chartLabels(""), nil, "")
	clitest.CreatePod(t, env, hooks, "old", "ghcr.io/handoff-dev/handoff:v0.8.0", chartLabels(""), nil, corev1.PodFailed)
	clitest.CreatePod(t, env, hooks, "not-the-webhook", "ghcr.io/handoff-dev/handoff:v0.7.0", map[string]string{"app.kubernetes.io/part-of": "handoff"}, nil, "")

	injected := map[string]string{inject.LabelInjected: "true"}
	at := func(v string) map[string]string { return map[string]string{inject.AnnotationVersion: v} }
	clitest.CreatePod(t, env, ns, "a", "w", injected, at("v0.2.0"), "")
	clitest.CreatePod(t, env, ns, "b", "w", injected, at("v0.2.0"), corev1.PodRunning)
	clitest.CreatePod(t, env, ns, "c", "w", injected, at("v0.10.0-rc.1"), "")
	clitest.CreatePod(t, env, ns, "d", "w", injected, nil, "") // injected before handoff.dev/version
	clitest.CreatePod(t, env, ns, "e", "w", injected, at("v0.2.1-dev.3.g1a2b3c4"), "")
	clitest.CreatePod(t, env, ns, "done", "w", injected, at("v0.1.0"), corev1.PodSucceeded)
	clitest.CreatePod(t, env, ns, "not-injected", "w", nil, at("v0.1.0"), "")
	clitest.CreatePod(t, env, other, "f", "w", injected, at("v0.2.0"), "")

	server, err := env.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	r := versionJSON(t, "--kubeconfig", env.Kubeconfig, "-n", ns, "--webhook-namespace", hooks)
	want := client.Report{Client: hversion.GetInfo(), Cluster: &client.Cluster{
		Reachable: true, Kubernetes: server.GitVersion,
		Webhook: &client.PodVersions{Namespace: hooks, Selector: kube.WebhookSelector, Versions: []client.VersionCount{
			{Version: "v0.10.0", Pods: 1}, {Version: "v0.9.0", Pods: 1}, {Version: kube.UnknownVersion, Pods: 1}}},
		Sidecars: &client.PodVersions{Namespace: ns, Selector: "handoff.dev/injected=true", Versions: []client.VersionCount{
			{Version: "v0.10.0-rc.1", Pods: 1}, {Version: "v0.2.1-dev.3.g1a2b3c4", Pods: 1}, {Version: "v0.2.0", Pods: 2}, {Version: kube.UnknownVersion, Pods: 1}}},
	}}
	if !reflect.DeepEqual(r, want) {
		got, _ := json.Marshal(r)
		wanted, _ := json.Marshal(want)
		t.Errorf("handoff version -n %s:\n%s\nwant\n%s", ns, got, wanted)
	}

	// Every namespace: the other namespace's v0.2.0 pod too (other tests'
	// injected pods may be there as well, of other versions).
	all := versionJSON(t, "--kubeconfig", env.Kubeconfig)
	// (At least: a run with -count leaves its pods to the next.)
	atLeast := func(p *client.PodVersions, v string, n int) bool {
		return p != nil && slices.ContainsFunc(p.Versions, func(c client.VersionCount) bool { return c.Version == v && c.Pods >= n })
	}
	if all.Cluster == nil || all.Cluster.Sidecars == nil || all.Cluster.Sidecars.Namespace != "" ||
		!atLeast(all.Cluster.Sidecars, "v0.2.0", 3) || !atLeast(all.Cluster.Webhook, "v0.10.0", 1) {
		t.Errorf("handoff version in every namespace: %+v; want 3 sidecars of v0.2.0 and the webhook's v0.10.0 among them", all.Cluster)
	}

	text := runVersionCommand(t, "--kubeconfig", env.Kubeconfig, "-n", ns, "--webhook-namespace", hooks)
	for _, line := range []string{
		"Kubernetes version: " + server.GitVersion + "\n",
		"Webhook versions: v0.10.0 (1 pod), v0.9.0 (1 pod), unknown (1 pod) in namespace " + hooks + "\n",
		"Sidecar versions: v0.10.0-rc.1 (1 pod), v0.2.1-dev.3.g1a2b3c4 (1 pod), v0.2.0 (2 pods), unknown (1 pod) in namespace " + ns + "\n",
	} {
		if !strings.Contains(text, line) {
			t.Errorf("handoff version lacks %q:\n%s", line, text)
		}
	}
	empty := env.Namespace(t)
	if text := runVersionCommand(t, "--kubeconfig", env.Kubeconfig, "-n", empty, "--webhook-namespace", empty); !strings.Contains(text,
		"Sidecar versions: no injected pods in namespace "+empty+" (label selector handoff.dev/injected=true)\n") {
		t.Errorf("handoff version in an empty namespace:\n%s\nwant a line saying no injected pods were found", text)
	}
	// --client asks the cluster nothing.
	if r := versionJSON(t, "--kubeconfig", env.Kubeconfig, "--client"); r.Cluster != nil || r.Client != hversion.GetInfo() {
		t.Errorf("handoff version --client: %+v; want the client alone", r)
	}
}

// Credentials that may list no pods: the cluster is reachable (every
// authenticated user may read /version), and the webhook's and sidecars'
// lines say why they are not known; the command succeeds.
func TestVersionCommandWithoutRightsToListPods(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	token := clitest.ServiceAccountToken(t, env, ns, "nobody")
	for k := range cfg.AuthInfos {
		cfg.AuthInfos[k] = &clientcmdapi.AuthInfo{Token: token}
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kc); err != nil {
		t.Fatal(err)
	}
	r := versionJSON(t, "--kubeconfig", kc, "-n", ns)
	c := r.Cluster
	if c == nil || !c.Reachable || c.Kubernetes == "" || c.Webhook == nil || c.Sidecars == nil ||
		!strings.Contains(c.Webhook.Error, "forbidden") || !strings.Contains(c.Sidecars.Error, "forbidden") ||
		c.Webhook.Versions == nil || len(c.Webhook.Versions) != 0 || len(c.Sidecars.Versions) != 0 {
		t.Errorf("handoff version without rights: %+v; want reachable, and forbidden for the webhook and the sidecars", c)
	}
	text := runVersionCommand(t, "--kubeconfig", kc, "-n", ns)
	if !strings.Contains(text, "Sidecar versions: cannot tell: pods is forbidden:") {
		t.Errorf("handoff version without rights:\n%s\nwant the sidecars' line to say the list is forbidden", text)
	}
}

// kubeconfigFor writes a kubeconfig whose server is host, without
// credentials.
func kubeconfigFor(t *testing.T, host string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: host, InsecureSkipTLSVerify: true}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// A cluster that refuses the connection, and one that accepts it and never
// answers: a line says it is unreachable, within --timeout, and the
// command succeeds with the client's version.
func TestVersionCommandWhenTheClusterIsUnreachable(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "https://" + closed.Addr().String()
	_ = closed.Close()

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = silent.Close() })
	var (
		mu   sync.Mutex
		held []net.Conn
	)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // never read, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})

	for _, tc := range []struct {
		what, host, timeout, want string
	}{
		{"refused", refused, "5s", "connection refused"},
		{"silent", "https://" + silent.Addr().String(), "1s", "no answer from https://" + silent.Addr().String() + " within 1s (--timeout)"},
	} {
		kc := kubeconfigFor(t, tc.host)
		start := time.Now()
		text := runVersionCommand(t, "--kubeconfig", kc, "--timeout", tc.timeout)
		took := time.Since(start)
		d, _ := time.ParseDuration(tc.timeout)
		if took > d+2*time.Second {
			t.Errorf("%s: took %s with --timeout %s", tc.what, took, tc.timeout)
		}
		if !strings.HasPrefix(text, "Client version: "+hversion.Get()+" (") ||
			!strings.Contains(text, "\nCluster: unreachable, so only the client's version is known: ") || !strings.Contains(text, tc.want) {
			t.Errorf("%s:\n%s\nwant the client's version, then a line saying the cluster is unreachable: %s", tc.what, text, tc.want)
		}
		r := versionJSON(t, "--kubeconfig", kc, "--timeout", tc.timeout)
		if r.Cluster == nil || r.Cluster.Reachable || !strings.Contains(r.Cluster.Error, tc.want) || r.Cluster.Webhook != nil || r.Cluster.Sidecars != nil {
			t.Errorf("%s: -o json cluster %+v; want reachable false and the error alone", tc.what, r.Cluster)
		}
	}
}

// No kubeconfig anywhere (no flag, no KUBECONFIG, no ~/.kube/config, not
// in a pod): a line says so, and the command succeeds.
func TestVersionCommandWithoutAKubeconfig(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(v string) bool {
		return strings.HasPrefix(v, "KUBECONFIG=") || strings.HasPrefix(v, "KUBERNETES_SERVICE_") || strings.HasPrefix(v, "HOME=")
	}), "HOME="+t.TempDir(), "HANDOFF_TEST_RUN_MAIN=version")
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), "Cluster: unreachable, so only the client's version is known: no kubeconfig: set --kubeconfig or KUBECONFIG, or write ~/.kube/config\n") {
		t.Errorf("handoff version without a kubeconfig: %v\n%s\nwant success and a line saying there is no kubeconfig", err, out)
	}
}

func TestVersionCommandRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "xml"}, `--output "xml": want json or yaml, or none for text`},
		{[]string{"--timeout", "0s"}, "--timeout 0s: want a duration above 0, like 5s"},
		{[]string{"--webhook-selector", "a in (b"}, `--webhook-selector "a in (b": want a label selector, like ` + kube.WebhookSelector},
		{[]string{"--kubeconfig", "/nonexistent/kubeconfig"}, "--kubeconfig: want a kubeconfig file: stat /nonexistent/kubeconfig"},
		{[]string{"extra"}, `unknown command "extra" for "handoff version"`},
	} {
		if err := command.Execute(context.Background(), version.Command, tc.args, nil, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("handoff version %s: %v; want an error with %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}
