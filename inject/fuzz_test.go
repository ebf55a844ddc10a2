package inject_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

// FuzzPod gives inject.Pod a pod with fuzzed handoff annotations (a key
// without "/" gets the handoff.dev/ prefix), grace period, worker preStop
// hook, worker probes' grace period, and hostPID, shareProcessNamespace or
// a second container named as the worker (flags). It checks that
//   - a refused or skipped pod is left exactly as it was, and each refusal
//     names the annotation or the field it is about;
//   - an injected pod has the sidecar, the install step and the worker's
//     preStop hook, is left alone by a second Pod, and the sidecar accepts
//     the settings the injector gave it: config.Load over the container's
//     environment succeeds and agrees with the annotations;
//   - an injected pod is neither hostPID, nor sharing its process namespace
//     without allowing it, nor has two containers of one name, and a kill
//     of its worker (by a probe or not) leaves the handover time: the
//     sidecar's deadline (prestop.TerminationOf) is after now plus the
//     handback reserve, never wrapped into the past.
//
// Run: go test ./inject -run '^$' -fuzz FuzzPod (or hack/fuzz.sh).
func FuzzPod(f *testing.F) {
	f.Add("true", "layout", "legacy", "fallback", "cancel", "leases", "work", int64(30), uint8(0), int64(0), uint8(0))
	f.Add("true", "container", "sidecar-of-mine", "wrap-prestop", "true", "retry-period", "1s", int64(-1), uint8(1), int64(0), uint8(0))
	f.Add("true", "wrap-prestop", "true", "lease-duration", "20s", "renew-deadline", "15s", int64(60), uint8(2), int64(0), uint8(0))
	f.Add("true", "wrap-prestop", "true", "metrics-addr", "127.0.0.1:7451", "control-addr", "[::1]:7450", int64(5), uint8(3), int64(0), uint8(0))
	f.Add("yes", "injct", "true", "Inject", "true", "status", "done", int64(30), uint8(0), int64(0), uint8(0))
	f.Add("false", "leases", "a,a", "", "", "", "", int64(0), uint8(0), int64(0), uint8(0))
	f.Add("", "status", "injected", "layout", "sideways", "", "", int64(30), uint8(0), int64(0), uint8(0))
	f.Add("true", "deadline-margin", "20s", "handback-reserve", "10s", "", "", int64(30), uint8(0), int64(0), uint8(0))
	f.Add("true", "app-url", "http://localhost:80", "metrics-addr", ":80", "control-addr", "127.0.0.1:0", int64(30), uint8(0), int64(0), uint8(0))
	f.Add("true", "app-url", "http://127.0.0.1:7452/", "metrics-addr", "[::]:9090", "", "", int64(9223372036), uint8(2), int64(0), uint8(0))
	f.Add("true", "shards", "orders-{0..11}", "shard-peers", "app=orders", "leases", "orders-leader", int64(30), uint8(0), int64(0), uint8(0))
	f.Add("true", "", "", "", "", "", "", int64(10000000000), uint8(0), int64(0), uint8(0))
	f.Add("true", "", "", "", "", "", "", int64(18446744080), uint8(0), int64(0), uint8(0))
	for _, seed := range []struct {
		k1, v1, k2, v2 string
		grace          int64
		hook           uint8
		probeGrace     int64
		flags          uint8
	}{
		// Probe grace periods beyond a time.Duration, and at its edges.
		{"", "", "", "", 30, 0, 10000000000, fuzzLiveness},
		{"", "", "", "", 30, 0, 10000000000, fuzzStartup},
		{"", "", "", "", 30, 0, math.MaxInt64, fuzzLiveness | fuzzStartup},
		{"", "", "", "", 30, 0, 4, fuzzLiveness},
		{"", "", "", "", 9223372036, 0, 9223372036, fuzzLiveness},
		{"", "", "", "", 9223372037, 0, 0, 0},
		{"", "", "", "", math.MaxInt64, 0, 0, 0},
		{"", "", "", "", -9223372037, 0, 0, fuzzNegativeGrace},
		{"deadline-margin", "2000000h", "handback-reserve", "2000000h", 30, 0, 0, 0},
		{"deadline-margin", "1h", "handback-reserve", "1h", 7201, 0, 7201, fuzzLiveness},
		{"wrap-prestop", "true", "", "", 30, 2, 0, 0},
		{"", "", "", "", 30, 0, 0, fuzzHostPID},
		{"", "", "", "", 30, 0, 0, fuzzShareProcessNamespace},
		{"allow-shared-process-namespace", "true", "", "", 30, 0, 0, fuzzShareProcessNamespace},
		{"allow-shared-process-namespace", "yes", "", "", 30, 0, 0, fuzzShareProcessNamespace},
		{"", "", "", "", 30, 0, 0, fuzzDuplicateName},
		{"container", "sidecar-of-mine", "", "", 30, 0, 0, fuzzDuplicateName},
	} {
		f.Add("true", seed.k1, seed.v1, seed.k2, seed.v2, "", "", seed.grace, seed.hook, seed.probeGrace, seed.flags)
	}
	f.Fuzz(func(t *testing.T, injectValue, k1, v1, k2, v2, k3, v3 string, grace int64, hook uint8, probeGrace int64, flags uint8) {
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
		probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}, TerminationGracePeriodSeconds: ptr.To(probeGrace)}
		if flags&fuzzLiveness != 0 {
			worker.LivenessProbe = probe
		}
		if flags&fuzzStartup != 0 {
			worker.StartupProbe = probe
		}
		meta := &metav1.ObjectMeta{Name: "p", Annotations: annotations}
		spec := &corev1.PodSpec{Containers: []corev1.Container{worker, {Name: "sidecar-of-mine", Image: "s"}}}
		if grace >= 0 || flags&fuzzNegativeGrace != 0 {
			spec.TerminationGracePeriodSeconds = ptr.To(grace)
		}
		spec.HostPID = flags&fuzzHostPID != 0
		if flags&fuzzShareProcessNamespace != 0 {
			spec.ShareProcessNamespace = ptr.To(true)
		}
		if flags&fuzzDuplicateName != 0 {
			spec.InitContainers = []corev1.Container{{Name: spec.Containers[1].Name, Image: "i"}}
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
		checkBounded(t, annotations, spec, flags)

		metaOnce, specOnce := meta.DeepCopy(), spec.DeepCopy()
		if res, err := inject.Pod(meta, spec, opts); err != nil || res != inject.AlreadyInjected ||
			!reflect.DeepEqual(meta, metaOnce) || !reflect.DeepEqual(spec, specOnce) {
			t.Fatalf("%q: a second Pod gave %s, %v, or changed the pod", annotations, res, err)
		}
	})
}

// FuzzPod's flags: what the pod has besides its annotations.
const (
	fuzzLiveness              = 1 << iota // the worker's liveness probe has probeGrace
	fuzzStartup                           // the worker's startup probe has probeGrace
	fuzzHostPID                           // spec.hostPID true
	fuzzShareProcessNamespace             // spec.shareProcessNamespace true
	fuzzDuplicateName                     // an init container named as the second container
	fuzzNegativeGrace                     // a negative grace is set, not left out
)

// checkBounded checks what an injected pod never has: a process namespace
// shared with the node, or with the pod's other containers unless allowed,
// two containers of one name, or a grace period (the pod's, or a probe's)
// that leaves the sidecar no time: a kill of the worker, by its probes or
// not, must give a deadline after now plus the handback reserve.
func checkBounded(t *testing.T, annotations map[string]string, spec *corev1.PodSpec, flags uint8) {
	t.Helper()
	if flags&fuzzHostPID != 0 || flags&fuzzDuplicateName != 0 ||
		(flags&fuzzShareProcessNamespace != 0 && annotations[inject.AnnotationAllowSharedProcessNamespace] != "true") {
		t.Fatalf("%q: injected a pod with flags %b (hostPID, a shared process namespace not allowed, or two containers of one name)", annotations, flags)
	}
	var sidecar corev1.Container
	for _, c := range spec.InitContainers {
		if c.Name == inject.SidecarName {
			sidecar = c
		}
	}
	for _, c := range spec.Containers {
		if c.Name == inject.SidecarName {
			sidecar = c
		}
	}
	env := envOf(sidecar)
	env["HANDOFF_POD_NAME"], env["HANDOFF_POD_UID"] = "p", "uid"
	s, err := config.Load(config.Environ(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
	if err != nil {
		t.Fatalf("%q: the sidecar refuses its environment: %v", annotations, err)
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, started := range []*bool{nil, ptr.To(true), ptr.To(false)} {
		pod := &corev1.Pod{Spec: *spec, Status: corev1.PodStatus{
			ContainerStatuses: []corev1.ContainerStatus{{Name: s.WorkerContainer, Started: started}}}}
		term := prestop.TerminationOf(pod, s.WorkerContainer, now, s.GracePeriod, s.DeadlineMargin)
		if !term.Deadline.After(now.Add(s.HandbackReserve)) || term.Deadline.After(now.Add(config.MaxGracePeriod)) {
			state := "unknown"
			if started != nil {
				state = fmt.Sprint(*started)
			}
			t.Errorf("%q: injected, but a kill of the worker (started: %s) gets deadline now%+.0fs from %s: no time for the handover (reserve %s)",
				annotations, state, term.Deadline.Sub(now).Seconds(), term.Source, s.HandbackReserve)
		}
	}
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
	if path.Dir(protocol.TokenFile) != inject.BinDir || !slices.Equal(install.Args[2:4], []string{"--token-file", protocol.TokenFile}) {
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
		// Numbers a float64 cannot hold, values of the wrong type,
		// out-of-range grace periods, duplicate names, hostPID.
		"apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {handoff.dev/inject: \"true\"}}\nspec: {terminationGracePeriodSeconds: 9223372036854775807, containers: [{name: w, image: w}]}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {handoff.dev/inject: \"true\"}}\nspec: {terminationGracePeriodSeconds: 18446744073709551616, containers: [{name: w, image: w}]}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {handoff.dev/inject: \"true\"}}\nspec: {terminationGracePeriodSeconds: 9.2e18, containers: [{name: w, image: w}]}\n",
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","annotations":{"handoff.dev/inject":"true"}},"spec":{"terminationGracePeriodSeconds":9223372036854775807,"containers":[{"name":"w","image":"w"}]}}`,
		"apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {handoff.dev/inject: \"true\"}}\nspec: {containers: [{name: w, image: w, livenessProbe: {exec: {command: [x]}, terminationGracePeriodSeconds: 10000000000}}]}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {handoff.dev/inject: \"true\", handoff.dev/deadline-margin: 2000000h, handoff.dev/handback-reserve: 2000000h}}\nspec: {containers: [{name: w, image: w}]}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {handoff.dev/inject: \"true\"}}\nspec: {containers: [{name: w, image: w}, {name: w, image: x}]}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {handoff.dev/inject: \"true\"}}\nspec: {containers: [{name: [w, w], image: w, env: [{name: A, value: 1}]}]}\n",
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    metadata: {labels: {handoff.dev/inject: \"true\"}}\n    spec: {hostPID: true, shareProcessNamespace: true, containers: [{name: w, image: w}]}\n",
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
