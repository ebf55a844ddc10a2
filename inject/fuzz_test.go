package inject_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/protocol"
)

// FuzzPod gives inject.Pod a pod with fuzzed handoff annotations (a key
// without "/" gets the handoff.dev/ prefix), grace period and worker preStop
// hook. It checks that
//   - a refused or skipped pod is left exactly as it was, and each refusal
//     names the annotation or the field it is about;
//   - an injected pod has the sidecar, the install step and the worker's
//     preStop hook, is left alone by a second Pod, and the sidecar accepts
//     the settings the injector gave it: config.Load over the container's
//     environment succeeds and agrees with the annotations.
//
// Run: go test ./inject -run '^$' -fuzz FuzzPod (or hack/fuzz.sh).
func FuzzPod(f *testing.F) {
	f.Add("true", "layout", "legacy", "fallback", "cancel", "leases", "work", int64(30), uint8(0))
	f.Add("true", "container", "sidecar-of-mine", "wrap-prestop", "true", "retry-period", "1s", int64(-1), uint8(1))
	f.Add("true", "wrap-prestop", "true", "lease-duration", "20s", "renew-deadline", "15s", int64(60), uint8(2))
	f.Add("true", "wrap-prestop", "true", "metrics-addr", "127.0.0.1:7451", "control-addr", "[::1]:7450", int64(5), uint8(3))
	f.Add("yes", "injct", "true", "Inject", "true", "status", "done", int64(30), uint8(0))
	f.Add("false", "leases", "a,a", "", "", "", "", int64(0), uint8(0))
	f.Add("", "status", "injected", "layout", "sideways", "", "", int64(30), uint8(0))
	f.Add("true", "deadline-margin", "20s", "handback-reserve", "10s", "", "", int64(30), uint8(0))
	f.Add("true", "app-url", "http://localhost:80", "metrics-addr", ":80", "control-addr", "127.0.0.1:0", int64(30), uint8(0))
	f.Add("true", "app-url", "http://127.0.0.1:7452/", "metrics-addr", "[::]:9090", "", "", int64(9223372036), uint8(2))
	f.Add("true", "shards", "orders-{0..11}", "shard-peers", "app=orders", "leases", "orders-leader", int64(30), uint8(0))
	f.Add("true", "", "", "", "", "", "", int64(10000000000), uint8(0))
	f.Add("true", "", "", "", "", "", "", int64(18446744080), uint8(0))
	f.Fuzz(func(t *testing.T, injectValue, k1, v1, k2, v2, k3, v3 string, grace int64, hook uint8) {
		annotations := map[string]string{"team": "queue"}
		if injectValue != "" {
			annotations[inject.AnnotationInject] = injectValue
		}
		for _, kv := range [][2]string{{k1, v1}, {k2, v2}, {k3, v3}} {
			if kv[0] == "" {
				continue
			}
			if !strings.Contains(kv[0], "/") {
				kv[0] = config.AnnotationPrefix + kv[0]
			}
			annotations[kv[0]] = kv[1]
		}
		worker := corev1.Container{Name: "worker", Image: "w"}
		switch hook % 4 {
		case 1:
			worker.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/drain", "--now"}}}}
		case 2:
			worker.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 3}}}
		case 3:
			worker.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/stop"}}}
		}
		meta := &metav1.ObjectMeta{Name: "p", Annotations: annotations}
		spec := &corev1.PodSpec{Containers: []corev1.Container{worker, {Name: "sidecar-of-mine", Image: "s"}}}
		if grace >= 0 {
			spec.TerminationGracePeriodSeconds = ptr.To(grace)
		}
		metaBefore, specBefore := meta.DeepCopy(), spec.DeepCopy()

		res, err := inject.Pod(meta, spec, opts)
		if err != nil || res != inject.Injected {
			if !reflect.DeepEqual(meta, metaBefore) || !reflect.DeepEqual(spec, specBefore) {
				t.Fatalf("%q: %s, %v, and the pod changed", annotations, res, err)
			}
			if err != nil {
				checkRefusal(t, annotations, err)
			} else if res != inject.Skipped && res != inject.AlreadyInjected {
				t.Fatalf("%q: result %q", annotations, res)
			}
			return
		}
		checkInjected(t, annotations, meta, spec)

		metaOnce, specOnce := meta.DeepCopy(), spec.DeepCopy()
		if res, err := inject.Pod(meta, spec, opts); err != nil || res != inject.AlreadyInjected ||
			!reflect.DeepEqual(meta, metaOnce) || !reflect.DeepEqual(spec, specOnce) {
			t.Fatalf("%q: a second Pod gave %s, %v, or changed the pod", annotations, res, err)
		}
	})
}

// checkRefusal checks that each problem of a refusal names the annotation
// or the field it is about.
func checkRefusal(t *testing.T, annotations map[string]string, err error) {
	t.Helper()
	for _, e := range leaves(err) {
		msg := e.Error()
		if !strings.HasPrefix(msg, "spec.") && !strings.HasPrefix(msg, "the handoff annotations are ") &&
			!strings.Contains(msg, "annotation "+config.AnnotationPrefix) && !strings.Contains(msg, "annotations "+config.AnnotationPrefix) {
			t.Errorf("%q: refusal %q names no annotation or field", annotations, msg)
		}
		if key, ok := strings.CutSuffix(msg, ": not a handoff annotation"); ok {
			if _, ok := annotations[strings.TrimPrefix(key, "annotation ")]; !ok {
				t.Errorf("%q: refusal %q names an annotation the pod does not have", annotations, msg)
			}
		}
	}
}

// leaves flattens joined errors.
func leaves(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leaves(e)...)
		}
		return out
	}
	return []error{err}
}

func checkInjected(t *testing.T, annotations map[string]string, meta *metav1.ObjectMeta, spec *corev1.PodSpec) {
	t.Helper()
	if meta.Annotations[inject.AnnotationStatus] != inject.StatusInjected {
		t.Fatalf("%q: injected pod has no %s", annotations, inject.AnnotationStatus)
	}
	var sidecar, install *corev1.Container
	names := map[string]bool{}
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range list {
			if names[list[i].Name] {
				t.Fatalf("%q: two containers named %q", annotations, list[i].Name)
			}
			names[list[i].Name] = true
			if list[i].Name == inject.SidecarName {
				sidecar = &list[i]
			}
			if list[i].Name == inject.InstallName {
				install = &list[i]
			}
		}
	}
	if sidecar == nil || !names[inject.InstallName] {
		t.Fatalf("%q: injected pod lacks the sidecar or the install step", annotations)
	}
	var workerEnv map[string]string
	workerName := annotations[inject.AnnotationContainer]
	if workerName == "" {
		workerName = "worker"
	}
	for _, c := range spec.Containers {
		if c.Name != workerName {
			continue
		}
		if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil ||
			!slices.Equal(c.Lifecycle.PreStop.Exec.Command[:2], []string{inject.BinDir + "/handoff", "prestop"}) {
			t.Fatalf("%q: worker %s has no handoff preStop hook: %+v", annotations, c.Name, c.Lifecycle)
		}
		workerEnv = envOf(c)
		if !slices.Contains(c.Lifecycle.PreStop.Exec.Command, "--token-file") || !mounted(c) {
			t.Fatalf("%q: worker %s's hook cannot send the pod's token: hook %q, mounts %+v", annotations, c.Name, c.Lifecycle.PreStop.Exec.Command, c.VolumeMounts)
		}
	}
	// The pod's token: written by the install step into the volume, read
	// by the sidecar, the hook and the worker from the same file.
	if path.Dir(protocol.TokenFile) != inject.BinDir || !slices.Equal(install.Args[2:], []string{"--token-file", protocol.TokenFile}) {
		t.Fatalf("%q: the install step %q does not write the token %s into %s", annotations, install.Args, protocol.TokenFile, inject.BinDir)
	}
	if !mounted(*sidecar) || envOf(*sidecar)[protocol.TokenFileEnv] != protocol.TokenFile || workerEnv[protocol.TokenFileEnv] != protocol.TokenFile {
		t.Fatalf("%q: the sidecar (mounts %+v, env %v) or the worker (env %v) does not read the token %s", annotations, sidecar.VolumeMounts, sidecar.Env, workerEnv, protocol.TokenFile)
	}
	// The service-account token: the sidecar's alone.
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for _, c := range list {
			has := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == inject.TokenMountPath })
			if has != (c.Name == inject.SidecarName) || ptr.Deref(spec.AutomountServiceAccountToken, true) {
				t.Fatalf("%q: container %s mounts the service-account token: %t; automount %v; want the sidecar's alone", annotations, c.Name, has, spec.AutomountServiceAccountToken)
			}
		}
	}

	// The sidecar must accept what the injector accepted.
	env := map[string]string{"HANDOFF_POD_NAME": "p", "HANDOFF_POD_NAMESPACE": "ns", "HANDOFF_POD_UID": "uid"}
	for _, e := range sidecar.Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	fromEnv, err := config.Load(config.Environ(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
	if err != nil {
		t.Fatalf("%q: injected, but the sidecar refuses its environment %q: %v", annotations, env, err)
	}
	fromAnnotations, err := config.Load(config.Annotations(annotations),
		config.Map(map[string]string{"pod-name": "p", "pod-namespace": "ns", "pod-uid": "uid", "grace-period": env["HANDOFF_GRACE_PERIOD"],
			"worker-container": workerName}, "pod"))
	if err != nil {
		t.Fatalf("%q: injected, but the annotations do not load: %v", annotations, err)
	}
	fromAnnotations.TokenFile = protocol.TokenFile
	if workerEnv[protocol.LeaseDurationEnv] != fromEnv.LeaseDuration.String() {
		t.Errorf("%q: the worker's %s is %q, the sidecar's lease duration %s", annotations, protocol.LeaseDurationEnv, workerEnv[protocol.LeaseDurationEnv], fromEnv.LeaseDuration)
	}
	if workerEnv[protocol.ShardsEnv] != strings.Join(fromEnv.Shards, ",") {
		t.Errorf("%q: the worker's %s is %q, the sidecar's shards %q", annotations, protocol.ShardsEnv, workerEnv[protocol.ShardsEnv], fromEnv.Shards)
	}
	if !reflect.DeepEqual(fromEnv, fromAnnotations) {
		t.Errorf("%q: the sidecar reads %+v, the annotations say %+v", annotations, fromEnv, fromAnnotations)
	}
	if g := spec.TerminationGracePeriodSeconds; g != nil && fromEnv.GracePeriod.Seconds() != float64(*g) {
		t.Errorf("%q: grace period %ds, the sidecar's %s", annotations, *g, fromEnv.GracePeriod)
	}
}

// FuzzManifests gives inject.Manifests a fuzzed stream of YAML or JSON
// documents. Either it returns an error and writes nothing, or its output
//   - parses back as YAML documents, as many objects as the input has
//     (a List counts once), each of the same kind, namespace and name;
//   - leaves every object it did not inject as it read it;
//   - is a fixed point: Manifests on the output writes it unchanged and
//     injects nothing.
//
// Run: go test ./inject -run '^$' -fuzz FuzzManifests (or hack/fuzz.sh).
func FuzzManifests(f *testing.F) {
	for _, name := range []string{"testdata/workloads.yaml"} {
		in, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(in)
	}
	pod := func(name, inject string) string {
		return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + name + `","annotations":{"handoff.dev/inject":"` + inject + `"}},"spec":{"containers":[{"name":"w","image":"w"}]}}`
	}
	for _, s := range []string{
		"",
		"---\n",
		"# only a comment\n",
		pod("j", "true") + "\n" + pod("k", "false"),
		pod("j", "true") + "{",
		"{\"kind\":\"Pod\"} trailing",
		"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {handoff.dev/inject: \"true\"}\nspec: {containers: [{name: w, image: w}]}\n--- # next\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
		"apiVersion: v1\nkind: List\nitems:\n- " + pod("in-list", "true") + "\n- apiVersion: v1\n  kind: Service\n  metadata: {name: s}\n",
		"apiVersion: v1\nkind: List\nitems: [1, 2]\n",
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    metadata:\n      annotations: {handoff.dev/inject: \"true\"}\n    spec: {containers: [{name: w, image: w}], terminationGracePeriodSeconds: 3}\n",
		"apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: c}\nspec: {jobTemplate: {spec: {template: {metadata: {annotations: {handoff.dev/inject: \"true\"}}, spec: {containers: [{name: w, image: w}]}}}}}\n",
		"- a\n- b\n",
		"just a string\n",
		"null\n",
		"a: 1\n...\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {handoff.dev/inject: \"true\"}}\nspec: {containers: [{name: w, image: w, ports: [{containerPort: 12345678901234567890}]}]}\n",
		"apiVersion: v1\r\nkind: Pod\r\nmetadata: {name: p, annotations: {handoff.dev/inject: \"true\"}}\r\nspec: {containers: [{name: w, image: w}]}\r\n---\r\nkind: ConfigMap\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		changes, err := inject.Manifests(bytes.NewReader(in), &out, opts)
		if err != nil {
			if out.Len() > 0 {
				t.Fatalf("error %v, and wrote %q", err, out.Bytes())
			}
			return
		}
		// Manifests reads some streams the readers here do not (a "--- value"
		// line, say): of those, check only that the output is a fixed point.
		inObjs, err := objects(in)
		parsed := err == nil
		var outObjs []map[string]any
		if parsed {
			if outObjs, err = objects(out.Bytes()); err != nil {
				t.Fatalf("output %q does not parse back: %v", out.Bytes(), err)
			}
		}
		if len(inObjs) != len(outObjs) {
			t.Fatalf("%d objects in, %d out:\n%q\n->\n%q", len(inObjs), len(outObjs), in, out.Bytes())
		}
		injected := map[string]bool{}
		for _, c := range changes {
			if c.Result == inject.Injected {
				injected[c.Kind+" "+c.Namespace+"/"+c.Name] = true
			}
		}
		for i := range inObjs { // none when not parsed
			a, b := inObjs[i], outObjs[i]
			if id(a) != id(b) {
				t.Fatalf("object %d was %s, is %s", i, id(a), id(b))
			}
			if !injected[id(a)] && !strings.HasSuffix(kindOf(a), "List") && !reflect.DeepEqual(a, b) {
				t.Errorf("object %d, %s, was not injected but changed:\n%v\n->\n%v", i, id(a), a, b)
			}
		}

		var again bytes.Buffer
		changes, err = inject.Manifests(bytes.NewReader(out.Bytes()), &again, opts)
		if err != nil {
			t.Fatalf("output %q: injecting it again: %v", out.Bytes(), err)
		}
		if !bytes.Equal(again.Bytes(), out.Bytes()) {
			t.Fatalf("injecting the output again changed it:\n%q\n->\n%q", out.Bytes(), again.Bytes())
		}
		for _, c := range changes {
			if c.Result == inject.Injected {
				t.Fatalf("%s %s injected a second time", c.Kind, c.Name)
			}
		}
	})
}

// objects parses a stream of YAML documents, each one YAML value or a
// stream of JSON values, with the API machinery's readers (as kubectl
// does, but a document at a time), skipping empty ones.
func objects(raw []byte) ([]map[string]any, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var objs []map[string]any
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(doc), 4096)
		for {
			var obj map[string]any
			err := d.Decode(&obj)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, err
			}
			if obj != nil {
				objs = append(objs, obj)
			}
		}
	}
}

func kindOf(obj map[string]any) string { k, _ := obj["kind"].(string); return k }

func id(obj map[string]any) string {
	meta, _ := obj["metadata"].(map[string]any)
	str := func(v any) string { s, _ := v.(string); return s }
	return str(obj["kind"]) + " " + str(meta["namespace"]) + "/" + str(meta["name"])
}

// envOf is the plain values of c's environment.
func envOf(c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	return env
}

// mounted reports whether c mounts the handoff volume read-only at BinDir.
func mounted(c corev1.Container) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == inject.VolumeName && m.MountPath == inject.BinDir && m.ReadOnly
	})
}
