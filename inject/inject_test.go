package inject_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/version"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var opts = inject.Options{
	Image:           "ghcr.io/handoff-dev/handoff-sidecar:v0.1.0",
	ImagePullPolicy: corev1.PullIfNotPresent,
	Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
	},
	Version: "v0.1.0",
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./inject -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test ./inject -update rewrites it after review); got:\n%s", path, got)
	}
}

func TestManifestsGolden(t *testing.T) {
	in, err := os.ReadFile("testdata/workloads.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	changes, err := inject.Manifests(bytes.NewReader(in), &out, opts)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "workloads.golden.yaml", out.Bytes())

	want := map[string]inject.Result{"orders": inject.Injected, "ledger": inject.Injected, "node-sweeper": inject.Injected,
		"backfill": inject.Injected, "nightly": inject.Injected, "mailer": inject.Injected, "wrapped": inject.Injected,
		"web": inject.Skipped, "settings": inject.Skipped, "in-a-list": inject.Injected}
	for _, c := range changes {
		if want[c.Name] != c.Result {
			t.Errorf("%s %s: %s, want %s", c.Kind, c.Name, c.Result, want[c.Name])
		}
		delete(want, c.Name)
	}
	if len(want) > 0 {
		t.Errorf("objects not reported: %v", want)
	}

	// Injecting the output again changes nothing.
	var again bytes.Buffer
	changes, err = inject.Manifests(bytes.NewReader(out.Bytes()), &again, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), out.Bytes()) {
		t.Errorf("second injection changed the output:\n%s", again.Bytes())
	}
	for _, c := range changes {
		if c.Result == inject.Injected {
			t.Errorf("%s %s injected twice", c.Kind, c.Name)
		}
	}
}

func pod(annotations map[string]string, containers ...corev1.Container) (*metav1.ObjectMeta, *corev1.PodSpec) {
	if len(containers) == 0 {
		containers = []corev1.Container{{Name: "worker", Image: "w"}}
	}
	return &metav1.ObjectMeta{Name: "p", Annotations: annotations}, &corev1.PodSpec{Containers: containers}
}

func TestPodRefusesWithNamedCause(t *testing.T) {
	on := func(kv ...string) map[string]string {
		m := map[string]string{"handoff.dev/inject": "true"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	hooked := func(h corev1.LifecycleHandler) corev1.Container {
		return corev1.Container{Name: "worker", Image: "w", Lifecycle: &corev1.Lifecycle{PreStop: &h}}
	}
	cases := []struct {
		name        string
		annotations map[string]string
		containers  []corev1.Container
		grace       *int64
		want        []string // all must appear in the error
	}{
		{"inject not a bool", map[string]string{"handoff.dev/inject": "yes"}, nil, nil,
			[]string{"handoff.dev/inject", `"yes"`, `"true" or "false"`}},
		{"bad layout", on("handoff.dev/layout", "sideways"), nil, nil,
			[]string{"handoff.dev/layout", `"sideways"`, `"native" or "legacy"`}},
		{"misspelt key", on("handoff.dev/lease", "work"), nil, nil,
			[]string{"handoff.dev/lease:", "not a handoff annotation", "the handoff annotations are", "handoff.dev/leases"}},
		{"control port 0", on("handoff.dev/control-addr", "127.0.0.1:0"), nil, nil,
			[]string{"handoff.dev/control-addr: port 0", "fixed port"}},
		{"ports shared", on("handoff.dev/metrics-addr", ":7452", "handoff.dev/app-url", "http://127.0.0.1:7452"), nil, nil,
			[]string{"handoff.dev/metrics-addr and handoff.dev/app-url: both use port 7452", "distinct ports"}},
		{"socket outside the run volume", on("handoff.dev/app-url", "unix:///tmp/app.sock"), nil, nil,
			[]string{"handoff.dev/app-url: socket /tmp/app.sock is not in /handoff-run", "/handoff-run/NAME.sock"}},
		{"one socket for both", on("handoff.dev/app-url", "unix:///handoff-run/control.sock"), nil, nil,
			[]string{"handoff.dev/control-addr and handoff.dev/app-url: both are unix:///handoff-run/control.sock", "distinct addresses"}},
		{"run mount path taken", on(), []corev1.Container{{Name: "worker", VolumeMounts: []corev1.VolumeMount{{Name: "tools", MountPath: "/handoff-run"}}}}, nil,
			[]string{"spec.containers[worker].volumeMounts", "/handoff-run", `"tools"`, "sockets"}},
		// Another container mounting the volumes by name is refused: it
		// would hold the token, the sockets and the sidecar's API token.
		{"another container mounts ours by name", on(), []corev1.Container{{Name: "worker"}, {Name: "logshipper", VolumeMounts: []corev1.VolumeMount{
			{Name: "handoff-bin", MountPath: "/b"}, {Name: "handoff-run", MountPath: "/r"}, {Name: "handoff-api-token", MountPath: "/t"}}}}, nil,
			[]string{`spec.containers[logshipper].volumeMounts: mounts volume "handoff-bin"`, `mounts volume "handoff-run"`, `mounts volume "handoff-api-token"`, "sidecar and the worker container alone"}},
		{"mount path taken", on(), []corev1.Container{{Name: "worker", VolumeMounts: []corev1.VolumeMount{{Name: "tools", MountPath: "/handoff-bin/"}}}}, nil,
			[]string{"spec.containers[worker].volumeMounts", "/handoff-bin", `"tools"`}},
		{"bad duration", on("handoff.dev/lease-duration", "fast"), nil, nil,
			[]string{"handoff.dev/lease-duration", "fast", "a duration of at least 2s"}},
		{"bad fallback", on("handoff.dev/fallback", "drop"), nil, nil,
			[]string{"handoff.dev/fallback", "drop", "one of return, cancel, abandon"}},
		{"no such container", on("handoff.dev/container", "app"), nil, nil,
			[]string{"handoff.dev/container", `"app"`, "worker"}},
		{"own preStop", on(), []corev1.Container{hooked(corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"x"}}})}, nil,
			[]string{"spec.containers[worker].lifecycle.preStop", "handoff.dev/wrap-prestop"}},
		{"httpGet preStop wrapped", on("handoff.dev/wrap-prestop", "true"), []corev1.Container{hooked(corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/"}})}, nil,
			[]string{"spec.containers[worker].lifecycle.preStop", "only exec and sleep"}},
		{"grace too short", on(), nil, ptr.To[int64](4),
			[]string{"spec.terminationGracePeriodSeconds 4", "handoff.dev/deadline-margin (2s)", "handoff.dev/handback-reserve (2s)"}},
		{"name taken", on(), []corev1.Container{{Name: "worker"}, {Name: "handoff"}}, nil,
			[]string{"spec.containers", `"handoff"`, "rename it"}},
		{"several at once", on("handoff.dev/layout", "x", "handoff.dev/retry-period", "0"), nil, nil,
			[]string{"handoff.dev/layout", "handoff.dev/retry-period"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			meta, spec := pod(tc.annotations, tc.containers...)
			spec.TerminationGracePeriodSeconds = tc.grace
			before := spec.DeepCopy()
			_, err := inject.Pod(meta, spec, opts)
			if err == nil {
				t.Fatal("injected; want a refusal")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if meta.Annotations["handoff.dev/status"] != "" || len(spec.InitContainers) != len(before.InitContainers) || len(spec.Containers) != len(before.Containers) {
				t.Error("a refused pod was changed")
			}
		})
	}
}

func TestPodRefusesMisspeltInjectKey(t *testing.T) {
	meta, spec := pod(map[string]string{"handoff.dev/Inject": "true"})
	if _, err := inject.Pod(meta, spec, opts); err == nil || !strings.Contains(err.Error(), "handoff.dev/Inject: not a handoff annotation") {
		t.Errorf("error %v: want the misspelt key named", err)
	}
}

func TestPodNamesTheAnnotationOfARelationError(t *testing.T) {
	meta, spec := pod(map[string]string{"handoff.dev/inject": "true", "handoff.dev/renew-deadline": "20s"})
	if _, err := inject.Pod(meta, spec, opts); err == nil || !strings.Contains(err.Error(), "annotation handoff.dev/renew-deadline: ") ||
		strings.Contains(err.Error(), "renew-deadline: renew-deadline") {
		t.Errorf("error %v: want it to name handoff.dev/renew-deadline, once", err)
	}
}

func TestPodLeavesOthersAlone(t *testing.T) {
	for _, a := range []map[string]string{nil, {"handoff.dev/inject": "false"}, {"handoff.dev/leases": "x"}} {
		meta, spec := pod(a)
		before := spec.DeepCopy()
		res, err := inject.Pod(meta, spec, opts)
		if err != nil || res != inject.Skipped {
			t.Errorf("annotations %v: %s, %v; want skipped", a, res, err)
		}
		if len(spec.InitContainers) != len(before.InitContainers) || spec.Containers[0].Lifecycle != nil {
			t.Errorf("annotations %v: pod changed", a)
		}
	}
}

// The label handoff.dev/inject, which the chart's webhook selects pods by,
// asks for injection as the annotation does; a bad value, or a label and an
// annotation that disagree, are refused naming both.
func TestPodAskedByLabel(t *testing.T) {
	for _, tc := range []struct {
		name                string
		labels, annotations map[string]string
		want                inject.Result
		wantErr             []string
		reason              inject.Reason
	}{
		{name: "label only", labels: map[string]string{"handoff.dev/inject": "true"}, want: inject.Injected},
		{name: "label and annotation", labels: map[string]string{"handoff.dev/inject": "true"},
			annotations: map[string]string{"handoff.dev/inject": "true", "handoff.dev/leases": "work"}, want: inject.Injected},
		{name: "label false", labels: map[string]string{"handoff.dev/inject": "false"}, want: inject.Skipped},
		{name: "label not a bool", labels: map[string]string{"handoff.dev/inject": "yes"},
			wantErr: []string{`label handoff.dev/inject: "yes" is not accepted; want "true" or "false"`}, reason: inject.ReasonInvalidLabel},
		{name: "label false, annotation true", labels: map[string]string{"handoff.dev/inject": "false"},
			annotations: map[string]string{"handoff.dev/inject": "true"},
			wantErr:     []string{`label handoff.dev/inject is "false" but annotation handoff.dev/inject is "true"`}, reason: inject.ReasonInvalidLabel},
		{name: "label true, annotation false", labels: map[string]string{"handoff.dev/inject": "true"},
			annotations: map[string]string{"handoff.dev/inject": "false"},
			wantErr:     []string{`label handoff.dev/inject is "true" but annotation handoff.dev/inject is "false"`}, reason: inject.ReasonInvalidLabel},
		{name: "label true, misspelt key", labels: map[string]string{"handoff.dev/inject": "true"},
			annotations: map[string]string{"handoff.dev/leasse": "work"},
			wantErr:     []string{"annotation handoff.dev/leasse: not a handoff annotation"}, reason: inject.ReasonUnknownAnnotation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta, spec := pod(tc.annotations)
			meta.Labels = tc.labels
			res, err := inject.Pod(meta, spec, opts)
			if len(tc.wantErr) == 0 {
				if err != nil || res != tc.want {
					t.Fatalf("%s, %v; want %s", res, err, tc.want)
				}
				if injected := len(spec.InitContainers) > 0; injected != (tc.want == inject.Injected) {
					t.Errorf("sidecar added: %v; want %v", injected, tc.want == inject.Injected)
				}
				return
			}
			if err == nil {
				t.Fatalf("%s, no error; want %q", res, tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if got := inject.Reasons(err); !slices.Contains(got, tc.reason) {
				t.Errorf("reasons %v; want %s", got, tc.reason)
			}
			if len(spec.InitContainers) > 0 {
				t.Errorf("refused, yet the pod changed")
			}
		})
	}
}

func TestAnnotationsDoc(t *testing.T) {
	path := filepath.Join("..", "docs", "annotations.md")
	got := []byte(inject.Markdown())
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s is not inject.Markdown() (%v); run go test ./inject -run TestAnnotationsDoc -update", path, err)
	}
}

func TestManifestsEdges(t *testing.T) {
	pod := func(name, inject string) string {
		return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + name + `","annotations":{"handoff.dev/inject":"` + inject + `"}},"spec":{"containers":[{"name":"w","image":"w"}]}}`
	}
	cases := []struct {
		name, in string
		wantOut  []string // in the output, in order
		wantErr  []string // in the error
		injected int
	}{
		{name: "JSON stream", in: pod("j", "true") + "\n" + pod("k", "true") + "\n",
			wantOut: []string{"name: j", "---\n", "name: k"}, injected: 2},
		{name: "unquoted boolean", in: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {handoff.dev/inject: true}\nspec: {containers: [{name: w, image: w}]}\n",
			wantErr: []string{"Pod p: annotation handoff.dev/inject: true is not a string (annotation values are quoted); want \"true\" or \"false\""}},
		{name: "misspelt inject key", in: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {handoff.dev/injct: \"true\"}\nspec: {containers: [{name: w, image: w}]}\n",
			wantErr: []string{"Pod p: annotation handoff.dev/injct: not a handoff annotation", "handoff.dev/inject"}},
		{name: "not annotated, loose types pass through", in: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: plain}\nspec:\n  template:\n    spec:\n      containers: [{name: w, image: w, env: [{name: PORT, value: 8080}]}]\n",
			wantOut: []string{"value: 8080"}},
		{name: "label asks for injection", in: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: labelled}\nspec:\n  template:\n    metadata:\n      labels: {app: w, handoff.dev/inject: \"true\"}\n    spec:\n      containers: [{name: w, image: w}]\n",
			wantOut: []string{"handoff.dev/status: injected", "name: handoff"}, injected: 1},
		{name: "patch without a template", in: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: scale}\nspec: {replicas: 3}\n",
			wantOut: []string{"spec: {replicas: 3}"}},
		{name: "unknown field is an error, not dropped", in: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {handoff.dev/inject: \"true\"}\nspec: {containers: [{name: w, image: w, imagePullPolicyy: Always}]}\n",
			wantErr: []string{"Pod p: reading the pod template", "imagePullPolicyy"}},
		{name: "two containers of one name", in: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {handoff.dev/inject: \"true\"}\nspec: {containers: [{name: w, image: w}, {name: w, image: x}]}\n",
			wantErr: []string{`Pod p: spec.containers[1].name: "w" is also the name of spec.containers[0]`}},
		{name: "comments and separators kept", in: "# licence header\n--- # second\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
			wantOut: []string{"# licence header\n--- # second\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"}},
		{name: "not UTF-8", in: "# a comment\n# \xfe\n",
			wantErr: []string{"line 2: not UTF-8"}},
		{name: "unsupported kind asking for injection", in: "apiVersion: extensions/v1beta1\nkind: Deployment\nmetadata: {name: old}\nspec:\n  template:\n    metadata:\n      annotations: {handoff.dev/inject: \"true\"}\n",
			wantErr: []string{"extensions/v1beta1 Deployment asks for injection", "apps/v1 Deployments"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			changes, err := inject.Manifests(strings.NewReader(tc.in), &out, opts)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error; output:\n%s", out.String())
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				if out.Len() > 0 {
					t.Errorf("wrote output despite the error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rest := out.String()
			for _, w := range tc.wantOut {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("output lacks %q (in order):\n%s", w, out.String())
				}
				rest = rest[i+len(w):]
			}
			n := 0
			for _, c := range changes {
				if c.Result == inject.Injected {
					n++
				}
			}
			if n != tc.injected {
				t.Errorf("injected %d objects, want %d", n, tc.injected)
			}
		})
	}
}

func TestPodRefusesWhatTheSidecarCannotRunIn(t *testing.T) {
	on := func() map[string]string { return map[string]string{"handoff.dev/inject": "true"} }
	cases := []struct {
		name   string
		spec   func(*corev1.PodSpec)
		reason inject.Reason
		want   []string
	}{
		{"host network", func(s *corev1.PodSpec) { s.HostNetwork = true }, inject.ReasonHostNetwork,
			[]string{"spec.hostNetwork true", "loopback is the node's", "share the sidecar's control and app ports", "reach the other pod's sidecar"}},
		// hostPID pods are refused.
		{"host PID", func(s *corev1.PodSpec) { s.HostPID = true }, inject.ReasonHostPID,
			[]string{"spec.hostPID true", "node's process namespace", "/proc/PID/root", "the pod's token", "hostPID false"}},
		{"shared process namespace", func(s *corev1.PodSpec) { s.ShareProcessNamespace = ptr.To(true) }, inject.ReasonShareProcessNamespace,
			[]string{"spec.shareProcessNamespace true", "every container of the pod", "/proc/PID/root", "the pod's token",
				`handoff.dev/allow-shared-process-namespace: "true"`}},
		// Two containers of one name are refused (the API refuses such a
		// pod, and the sidecar and the hook could each take a different one
		// for the worker).
		{"two containers of one name", func(s *corev1.PodSpec) {
			s.Containers = append(s.Containers, corev1.Container{Name: "worker", Image: "x"})
		},
			inject.ReasonDuplicateContainerName, []string{`spec.containers[1].name: "worker" is also the name of spec.containers[0]`, "unique"}},
		{"an init container of the worker's name", func(s *corev1.PodSpec) { s.InitContainers = []corev1.Container{{Name: "worker", Image: "x"}} },
			inject.ReasonDuplicateContainerName, []string{`spec.initContainers[0].name: "worker" is also the name of spec.containers[0]`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			meta, spec := pod(on())
			tc.spec(spec)
			before := spec.DeepCopy()
			_, err := inject.Pod(meta, spec, opts)
			if err == nil {
				t.Fatal("injected; want a refusal")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if got := inject.Reasons(err); len(got) != 1 || got[0] != tc.reason {
				t.Errorf("reasons %v, want [%s]", got, tc.reason)
			}
			if meta.Annotations["handoff.dev/status"] != "" || len(spec.InitContainers) != len(before.InitContainers) {
				t.Error("a refused pod was changed")
			}
		})
	}
	// What is allowed stays allowed: the token turned on or off, no host
	// network or PID, a process namespace not shared.
	for _, automount := range []bool{true, false} {
		meta, spec := pod(on())
		spec.AutomountServiceAccountToken = ptr.To(automount)
		spec.HostNetwork, spec.HostPID, spec.ShareProcessNamespace = false, false, ptr.To(false)
		if res, err := inject.Pod(meta, spec, opts); err != nil || res != inject.Injected {
			t.Errorf("pod with automountServiceAccountToken %t: %s, %v; want injected", automount, res, err)
		}
	}
	// A shared process namespace, where the pod opts in.
	a := on()
	a["handoff.dev/allow-shared-process-namespace"] = "true"
	meta, spec := pod(a)
	spec.ShareProcessNamespace = ptr.To(true)
	if res, err := inject.Pod(meta, spec, opts); err != nil || res != inject.Injected {
		t.Errorf("pod with shareProcessNamespace true, allowed: %s, %v; want injected", res, err)
	}
}

// Every refusal carries its code; several problems give several codes.
func TestRefusalReasons(t *testing.T) {
	meta, spec := pod(map[string]string{"handoff.dev/inject": "true", "handoff.dev/layout": "x", "handoff.dev/lease": "y",
		"handoff.dev/metrics-addr": ":7452", "handoff.dev/app-url": "http://127.0.0.1:7452"}, corev1.Container{Name: "worker"}, corev1.Container{Name: "handoff"})
	spec.HostNetwork = true
	spec.TerminationGracePeriodSeconds = ptr.To[int64](3)
	_, err := inject.Pod(meta, spec, opts)
	got := inject.Reasons(err)
	want := []inject.Reason{inject.ReasonGracePeriod, inject.ReasonHostNetwork, inject.ReasonInvalidAnnotation,
		inject.ReasonNameTaken, inject.ReasonPorts, inject.ReasonUnknownAnnotation}
	if !slices.Equal(got, want) {
		t.Errorf("reasons %v, want %v (error %v)", got, want, err)
	}
	if r := inject.Reasons(fmt.Errorf("Pod p: %w", err)); !slices.Equal(r, want) {
		t.Errorf("reasons of a wrapped error %v, want %v", r, want)
	}
	if r := inject.Reasons(errors.New("other")); len(r) != 0 {
		t.Errorf("reasons of a plain error %v, want none", r)
	}
}

// A shard-peers selector must select the pod's own labels (a pod counts
// itself up from the same watch), and not a label of one revision; either
// is refused naming the annotation, and the pod is left as it was.
func TestShardPeersSelectThePodItself(t *testing.T) {
	podLabels := map[string]string{"app": "orders", "pod-template-hash": "5d8f"}
	for _, tc := range []struct {
		name, peers string
		wantErr     []string
	}{
		{name: "the workload's label", peers: "app=orders"},
		{name: "a set-based selector", peers: "app in (orders,billing)"},
		{name: "another workload's label", peers: "app=billing",
			wantErr: []string{`annotation handoff.dev/shard-peers: "app=billing" does not select this pod's own labels (app=orders,pod-template-hash=5d8f)`, "never take a shard", "want a label selector"}},
		{name: "a label the pod lacks", peers: "app=orders,tier=queue",
			wantErr: []string{`"app=orders,tier=queue" does not select this pod's own labels`}},
		{name: "pod-template-hash", peers: "app=orders,pod-template-hash=5d8f",
			wantErr: []string{`annotation handoff.dev/shard-peers: "app=orders,pod-template-hash=5d8f" selects on pod-template-hash, which differs per revision`, "want a label selector on the workload's own labels"}},
		{name: "controller-revision-hash", peers: "controller-revision-hash",
			wantErr: []string{"selects on controller-revision-hash"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta, spec := pod(map[string]string{"handoff.dev/inject": "true", "handoff.dev/shards": "orders-{0..3}", "handoff.dev/shard-peers": tc.peers})
			meta.Labels = maps.Clone(podLabels) // Pod labels an injected pod in place
			res, err := inject.Pod(meta, spec, opts)
			if len(tc.wantErr) == 0 {
				if err != nil || res != inject.Injected {
					t.Fatalf("%s, %v; want %s", res, err, inject.Injected)
				}
				return
			}
			if err == nil {
				t.Fatalf("%s, no error; want %q", res, tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if got := inject.Reasons(err); !slices.Equal(got, []inject.Reason{inject.ReasonInvalidAnnotation}) {
				t.Errorf("reasons %v; want [%s]", got, inject.ReasonInvalidAnnotation)
			}
			if len(spec.InitContainers) > 0 {
				t.Errorf("refused, yet the pod changed")
			}
		})
	}
}

// Every grace period and duration of an injected pod is bounded, the pod's
// and the worker's probes', and refused naming the field or the
// annotation, the value and the bound: a probe's 10000000000 s (from which
// the sidecar would compute a deadline millions of hours in the past), and
// a deadline-margin and handback-reserve of 2000000h (whose sum wraps
// negative).
func TestPodBoundsEveryGracePeriod(t *testing.T) {
	probe := func(seconds int64) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}, TerminationGracePeriodSeconds: ptr.To(seconds)}
	}
	on := map[string]string{"handoff.dev/inject": "true"} // copied per case: an injected pod's map gets the status
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		mutate      func(*corev1.PodSpec)
		reason      inject.Reason
		want        []string
	}{
		{"liveness probe 10000000000 s", on, func(s *corev1.PodSpec) { s.Containers[0].LivenessProbe = probe(10000000000) }, inject.ReasonGracePeriod,
			[]string{"spec.containers[worker].livenessProbe.terminationGracePeriodSeconds 10000000000: must be at most 9223372036 (2562047h47m16s)"}},
		{"startup probe 10000000000 s", on, func(s *corev1.PodSpec) { s.Containers[0].StartupProbe = probe(10000000000) }, inject.ReasonGracePeriod,
			[]string{"spec.containers[worker].startupProbe.terminationGracePeriodSeconds 10000000000: must be at most 9223372036"}},
		{"liveness probe too short for the handover", on, func(s *corev1.PodSpec) { s.Containers[0].LivenessProbe = probe(4) }, inject.ReasonGracePeriod,
			[]string{"spec.containers[worker].livenessProbe.terminationGracePeriodSeconds 4: must be more than handoff.dev/deadline-margin (2s) plus handoff.dev/handback-reserve (2s)"}},
		{"pod 9223372036854775807 s", on, func(s *corev1.PodSpec) { s.TerminationGracePeriodSeconds = ptr.To[int64](math.MaxInt64) }, inject.ReasonGracePeriod,
			[]string{"spec.terminationGracePeriodSeconds 9223372036854775807: must be at most 9223372036"}},
		{"pod -9223372037 s", on, func(s *corev1.PodSpec) { s.TerminationGracePeriodSeconds = ptr.To[int64](-9223372037) }, inject.ReasonGracePeriod,
			[]string{"spec.terminationGracePeriodSeconds -9223372037: must be more than"}},
		{"margins of 2000000h", map[string]string{"handoff.dev/inject": "true", "handoff.dev/deadline-margin": "2000000h", "handoff.dev/handback-reserve": "2000000h"}, nil, inject.ReasonInvalidAnnotation,
			[]string{`invalid value "2000000h" for annotation handoff.dev/deadline-margin: above the maximum 1h0m0s; want a duration from 0s to 1h`,
				`invalid value "2000000h" for annotation handoff.dev/handback-reserve: above the maximum 1h0m0s; want a duration from 0s to 1h`}},
		{"wrapped sleep of 10000000000 s", map[string]string{"handoff.dev/inject": "true", "handoff.dev/wrap-prestop": "true"}, func(s *corev1.PodSpec) {
			s.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 10000000000}}}
		}, inject.ReasonPreStop, []string{"spec.containers[worker].lifecycle.preStop.sleep.seconds 10000000000: must be from 0 to the pod's terminationGracePeriodSeconds (30)"}},
		{"wrapped sleep of -1 s", map[string]string{"handoff.dev/inject": "true", "handoff.dev/wrap-prestop": "true"}, func(s *corev1.PodSpec) {
			s.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: -1}}}
		}, inject.ReasonPreStop, []string{"spec.containers[worker].lifecycle.preStop.sleep.seconds -1: must be from 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta, spec := pod(maps.Clone(tc.annotations))
			if tc.mutate != nil {
				tc.mutate(spec)
			}
			before := spec.DeepCopy()
			res, err := inject.Pod(meta, spec, opts)
			if err == nil {
				t.Fatalf("%s; want a refusal", res)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if got := inject.Reasons(err); !slices.Equal(got, []inject.Reason{tc.reason}) {
				t.Errorf("reasons %v, want [%s]", got, tc.reason)
			}
			if len(spec.InitContainers) != len(before.InitContainers) || meta.Annotations["handoff.dev/status"] != "" {
				t.Error("a refused pod was changed")
			}
		})
	}
	// The bounds themselves are injected.
	meta, spec := pod(map[string]string{"handoff.dev/inject": "true", "handoff.dev/deadline-margin": "1h", "handoff.dev/handback-reserve": "1h"})
	spec.TerminationGracePeriodSeconds = ptr.To[int64](9223372036)
	spec.Containers[0].LivenessProbe = probe(9223372036)
	spec.Containers[0].StartupProbe = probe(2*3600 + 1)
	if res, err := inject.Pod(meta, spec, opts); err != nil || res != inject.Injected {
		t.Errorf("grace periods at their bounds: %s, %v; want injected", res, err)
	}
}

// handoff inject reads a pod template's numbers as written and names the
// field of a value of the wrong type: a grace period of
// 9223372036854775807 is not read through a float64 (which would report
// -9223372036854775808), one above int64 is refused rather than wrapped,
// and a number where a string belongs is named by its field.
func TestManifestsReadNumbersAndTypesAsWritten(t *testing.T) {
	pod := func(spec string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {handoff.dev/inject: \"true\"}\nspec:\n" + spec
	}
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"grace period 9223372036854775807", pod("  terminationGracePeriodSeconds: 9223372036854775807\n  containers: [{name: w, image: w}]\n"),
			[]string{"Pod p: spec.terminationGracePeriodSeconds 9223372036854775807: must be at most 9223372036"}},
		{"grace period -9223372036854775808", pod("  terminationGracePeriodSeconds: -9223372036854775808\n  containers: [{name: w, image: w}]\n"),
			[]string{"Pod p: spec.terminationGracePeriodSeconds -9223372036854775808: must be more than"}},
		{"grace period above int64", pod("  terminationGracePeriodSeconds: 18446744073709551616\n  containers: [{name: w, image: w}]\n"),
			[]string{"Pod p: reading the pod template", "spec.terminationGracePeriodSeconds", "int64"}},
		{"grace period in exponent form above int64", pod("  terminationGracePeriodSeconds: 1e19\n  containers: [{name: w, image: w}]\n"),
			[]string{"Pod p: reading the pod template", "spec.terminationGracePeriodSeconds", "int64"}},
		{"JSON grace period 9223372036854775807", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","annotations":{"handoff.dev/inject":"true"}},"spec":{"terminationGracePeriodSeconds":9223372036854775807,"containers":[{"name":"w","image":"w"}]}}`,
			[]string{"Pod p: spec.terminationGracePeriodSeconds 9223372036854775807: must be at most 9223372036"}},
		{"probe grace period 10000000000", pod("  containers: [{name: w, image: w, livenessProbe: {exec: {command: [\"true\"]}, terminationGracePeriodSeconds: 10000000000}}]\n"),
			[]string{"Pod p: spec.containers[w].livenessProbe.terminationGracePeriodSeconds 10000000000: must be at most 9223372036"}},
		{"a number for a string", pod("  containers: [{name: w, image: w, env: [{name: PORT, value: 8080}]}]\n"),
			[]string{"Pod p: reading the pod template", "spec.containers.env.value", "string"}},
		{"a list for a container name", pod("  containers: [{name: [w, w], image: w}]\n"),
			[]string{"Pod p: reading the pod template", "spec.containers.name", "string"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			_, err := inject.Manifests(strings.NewReader(tc.in), &out, opts)
			if err == nil {
				t.Fatalf("no error; output:\n%s", out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			for _, bad := range []string{"unrecognized type", "-9223372036854775808:"} {
				if strings.Contains(err.Error(), bad) && !strings.Contains(tc.in, strings.TrimSuffix(bad, ":")) {
					t.Errorf("error %q says %q", err, bad)
				}
			}
		})
	}
	// Numbers are written back as read.
	var out bytes.Buffer
	if _, err := inject.Manifests(strings.NewReader(pod("  terminationGracePeriodSeconds: 9223372036\n  containers: [{name: w, image: w, ports: [{containerPort: 8080}]}]\n")), &out, opts); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"terminationGracePeriodSeconds: 9223372036\n", "containerPort: 8080\n", "--timeout\n          - 9223372036s\n"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
}

// An injected pod carries the label handoff.dev/injected: "true", which the
// chart's NetworkPolicy for the sidecar's port selects (a policy selects
// pods by label only), and handoff.dev/version, beside its own labels; a
// refused pod gets none.
func TestInjectedPodIsLabelled(t *testing.T) {
	meta, spec := pod(map[string]string{"handoff.dev/inject": "true"}, corev1.Container{Name: "worker"})
	meta.Labels = map[string]string{"app": "orders"}
	if res, err := inject.Pod(meta, spec, opts); err != nil || res != inject.Injected {
		t.Fatalf("inject: %s, %v", res, err)
	}
	if want := map[string]string{"app": "orders", inject.LabelInjected: "true", inject.LabelVersion: "v0.1.0"}; !maps.Equal(meta.Labels, want) {
		t.Errorf("labels %v; want %v", meta.Labels, want)
	}
	// Without labels of its own, and refused.
	meta, spec = pod(map[string]string{"handoff.dev/inject": "true"}, corev1.Container{Name: "worker"})
	if _, err := inject.Pod(meta, spec, opts); err != nil || meta.Labels[inject.LabelInjected] != "true" {
		t.Errorf("pod without labels: %v, labels %v; want %s: \"true\"", err, meta.Labels, inject.LabelInjected)
	}
	meta, spec = pod(map[string]string{"handoff.dev/inject": "true", "handoff.dev/layout": "x"}, corev1.Container{Name: "worker"})
	if _, err := inject.Pod(meta, spec, opts); err == nil || meta.Labels[inject.LabelInjected] != "" {
		t.Errorf("refused pod: %v, labels %v; want refused and no %s", err, meta.Labels, inject.LabelInjected)
	}
}

// An init container that mounts handoff-bin by name would run before the
// install step and write a token of its choice, which the install step
// keeps: refused, naming it.
func TestInitContainerMountingOursIsRefused(t *testing.T) {
	meta, spec := pod(map[string]string{"handoff.dev/inject": "true"}, corev1.Container{Name: "worker"})
	spec.InitContainers = []corev1.Container{{Name: "early", Image: "x", VolumeMounts: []corev1.VolumeMount{{Name: inject.VolumeName, MountPath: "/b"}}}}
	_, err := inject.Pod(meta, spec, opts)
	if err == nil || !strings.Contains(err.Error(), `spec.initContainers[early].volumeMounts: mounts volume "handoff-bin"`) ||
		!slices.Equal(inject.Reasons(err), []inject.Reason{inject.ReasonNameTaken}) {
		t.Fatalf("Pod = %v (reasons %v); want refused naming the init container's mount, reason %s", err, inject.Reasons(err), inject.ReasonNameTaken)
	}
}

// Every injected pod carries the injector's version, as an annotation and
// a label; what the pod said there itself is replaced (a pod cannot pass
// for another version), a version that cannot be a label value is an
// annotation alone (and a label the pod had is removed), and an injector
// without a version of its own writes this build's. An injected pod is
// left alone, version and all.
func TestInjectedPodCarriesTheInjectorsVersion(t *testing.T) {
	check := func(what string, o inject.Options, annotations, labels map[string]string, wantLabel string) {
		t.Helper()
		meta, spec := pod(annotations, corev1.Container{Name: "worker"})
		meta.Labels = labels
		if res, err := inject.Pod(meta, spec, o); err != nil || res != inject.Injected {
			t.Fatalf("%s: %s, %v; want injected", what, res, err)
		}
		want := o.Version
		if want == "" {
			want = version.Get()
		}
		if got := meta.Annotations[inject.AnnotationVersion]; got != want {
			t.Errorf("%s: annotation %s = %q, want %q", what, inject.AnnotationVersion, got, want)
		}
		if got, ok := meta.Labels[inject.LabelVersion]; got != wantLabel || ok != (wantLabel != "") {
			t.Errorf("%s: label %s = %q (set %v), want %q", what, inject.LabelVersion, got, ok, wantLabel)
		}
	}
	asks := func(extra ...string) map[string]string {
		a := map[string]string{"handoff.dev/inject": "true"}
		for i := 0; i+1 < len(extra); i += 2 {
			a[extra[i]] = extra[i+1]
		}
		return a
	}
	check("plain", opts, asks(), nil, "v0.1.0")
	check("a version set by the pod", opts, asks(inject.AnnotationVersion, "v9.9.9"), map[string]string{inject.LabelVersion: "v9.9.9"}, "v0.1.0")
	dev := opts
	dev.Version = "v0.2.1-dev.3.g2c1ee26.dirty"
	check("a development version", dev, asks(), nil, dev.Version)
	bad := opts
	bad.Version = "v0.2.0+build.1"
	check("a version no label may hold", bad, asks(), map[string]string{inject.LabelVersion: "v9.9.9"}, "")
	long := opts
	long.Version = "v0.2.0-" + strings.Repeat("a", 60)
	check("a version longer than a label", long, asks(), nil, "")
	this := opts
	this.Version = ""
	check("no version given", this, asks(), nil, version.Get())

	// Already injected: left alone, its version with it.
	meta, spec := pod(asks(inject.AnnotationStatus, inject.StatusInjected, inject.AnnotationVersion, "v0.0.9"), corev1.Container{Name: "worker"})
	if res, err := inject.Pod(meta, spec, opts); err != nil || res != inject.AlreadyInjected || meta.Annotations[inject.AnnotationVersion] != "v0.0.9" {
		t.Errorf("already injected: %s, %v, version %q; want left alone with v0.0.9", res, err, meta.Annotations[inject.AnnotationVersion])
	}
	// A pod that does not ask: the key is handoff's own, not unknown, and
	// nothing is added.
	meta, spec = pod(map[string]string{inject.AnnotationVersion: "v0.0.9"}, corev1.Container{Name: "worker"})
	if res, err := inject.Pod(meta, spec, opts); err != nil || res != inject.Skipped || len(meta.Labels) != 0 {
		t.Errorf("not asking, with %s: %s, %v, labels %v; want skipped, unchanged", inject.AnnotationVersion, res, err, meta.Labels)
	}
}
