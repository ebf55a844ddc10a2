package inject_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
)

// installStep returns the injected install container.
func installStep(t *testing.T, spec *corev1.PodSpec) corev1.Container {
	t.Helper()
	for _, c := range spec.InitContainers {
		if c.Name == inject.InstallName {
			return c
		}
	}
	t.Fatalf("no %s init container", inject.InstallName)
	return corev1.Container{}
}

// The pod's token file is readable by the worker's user and the sidecar
// alone where the injector can tell the worker's user: the install step
// runs as that user (the file's owner; group 65532, the sidecar's) and
// writes the file 0440. With no runAsUser but an fsGroup, it runs as 65532
// and the file is 0440 in a volume of the fsGroup, which the worker has.
// With neither (or root) it is 0444, readable by every user of the worker
// container. It was 0644 for every pod.
func TestTokenFileReadableByTheWorkersUserAlone(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pod       *corev1.PodSecurityContext
		worker    *corev1.SecurityContext
		wantUser  int64
		wantMode  string
		wantGroup int64
	}{
		{"the worker container's runAsUser", nil, &corev1.SecurityContext{RunAsUser: ptr.To[int64](1000)}, 1000, "0440", 65532},
		{"the pod's runAsUser", &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](2000)}, nil, 2000, "0440", 65532},
		{"the container's over the pod's", &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](2000)}, &corev1.SecurityContext{RunAsUser: ptr.To[int64](3000)}, 3000, "0440", 65532},
		{"an fsGroup alone", &corev1.PodSecurityContext{FSGroup: ptr.To[int64](4000)}, nil, 65532, "0440", 65532},
		{"root", &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](0)}, nil, 65532, "0444", 65532},
		{"neither", nil, nil, 65532, "0444", 65532},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta, spec := pod(map[string]string{"handoff.dev/inject": "true"}, corev1.Container{Name: "worker", Image: "w", SecurityContext: tc.worker})
			spec.SecurityContext = tc.pod
			if _, err := inject.Pod(meta, spec, opts); err != nil {
				t.Fatal(err)
			}
			install := installStep(t, spec)
			sc := install.SecurityContext
			if got := ptr.Deref(sc.RunAsUser, -1); got != tc.wantUser {
				t.Errorf("install runs as user %d, want %d", got, tc.wantUser)
			}
			if got := ptr.Deref(sc.RunAsGroup, -1); got != tc.wantGroup {
				t.Errorf("install runs as group %d, want %d", got, tc.wantGroup)
			}
			if i := slices.Index(install.Args, "--token-mode"); i < 0 || i+1 >= len(install.Args) || install.Args[i+1] != tc.wantMode {
				t.Errorf("install args %q; want --token-mode %s", install.Args, tc.wantMode)
			}
			if !ptr.Deref(sc.RunAsNonRoot, false) || ptr.Deref(sc.AllowPrivilegeEscalation, true) {
				t.Errorf("install security context %+v; want non-root, no privilege escalation", sc)
			}
		})
	}
}

// A service account token volume of the pod's own named like the API
// server's (kube-api-access-*) is kept, with its mounts, and a warning
// names it: in a pod that turned the token off (the ServiceAccount
// admission plugin added nothing), and one whose shape is not the
// plugin's. Before, injection removed it and its mounts without a word.
// The plugin's own volume is still removed (TestOnlyTheSidecarHoldsTheToken).
func TestOwnTokenVolumeNamedLikeTheAPIServersIsKept(t *testing.T) {
	plugin := automountedVolume()
	own := corev1.Volume{Name: "kube-api-access-mine", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", Path: "token"}}}}}}
	for _, tc := range []struct {
		name      string
		automount *bool
		vol       corev1.Volume
	}{
		{"its own shape", nil, own},
		{"the plugin's shape in a pod that turned the token off", ptr.To(false), plugin},
		{"its own shape in a pod that turned the token off", ptr.To(false), own},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mount := corev1.VolumeMount{Name: tc.vol.Name, MountPath: "/var/run/secrets/mine", ReadOnly: true}
			meta, spec := pod(map[string]string{"handoff.dev/inject": "true"},
				corev1.Container{Name: "worker", Image: "w", VolumeMounts: []corev1.VolumeMount{mount}})
			spec.Volumes = []corev1.Volume{tc.vol}
			spec.AutomountServiceAccountToken = tc.automount
			if _, err := inject.Pod(meta, spec, opts); err != nil {
				t.Fatal(err)
			}
			if i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == tc.vol.Name }); i < 0 || !equality.Semantic.DeepEqual(spec.Volumes[i], tc.vol) {
				t.Errorf("volume %s removed or changed; want it kept as it was", tc.vol.Name)
			}
			if !slices.ContainsFunc(spec.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool { return equality.Semantic.DeepEqual(m, mount) }) {
				t.Errorf("the worker's mount of %s removed; want it kept", tc.vol.Name)
			}
			w := strings.Join(inject.Warnings(spec), "\n")
			if !strings.Contains(w, "spec.volumes["+tc.vol.Name+"]: a service account token volume of the pod's own") {
				t.Errorf("warnings %q; want one naming %s", w, tc.vol.Name)
			}
		})
	}
}

// Injection leaves ephemeral containers alone: a create that names one
// (which the API server refuses: they are added through their own
// subresource) gets no mount, variable or hook in it.
func TestEphemeralContainersAreLeftAlone(t *testing.T) {
	meta, spec := pod(map[string]string{"handoff.dev/inject": "true"})
	spec.EphemeralContainers = []corev1.EphemeralContainer{{TargetContainerName: "worker",
		EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "busybox"}}}
	before := spec.DeepCopy().EphemeralContainers
	if _, err := inject.Pod(meta, spec, opts); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(spec.EphemeralContainers, before) {
		t.Errorf("ephemeral containers %+v; want them as they were, %+v", spec.EphemeralContainers, before)
	}
}

// A container that shares an injected pod and is privileged, or mounts a
// hostPath volume, may read the node's copy of the pod's volumes (the
// token, the sockets): the admission answer warns, naming it. Handoff's
// own containers and the worker are not named.
func TestWarningForPrivilegedOrHostPathNeighbours(t *testing.T) {
	meta, spec := pod(map[string]string{"handoff.dev/inject": "true"},
		corev1.Container{Name: "worker", Image: "w", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}},
		corev1.Container{Name: "node-agent", Image: "a", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}},
		corev1.Container{Name: "log-shipper", Image: "l", VolumeMounts: []corev1.VolumeMount{{Name: "varlog", MountPath: "/var/log"}}},
		corev1.Container{Name: "plain", Image: "p"})
	spec.InitContainers = []corev1.Container{{Name: "setup", Image: "s", VolumeMounts: []corev1.VolumeMount{{Name: "varlog", MountPath: "/var/log"}}}}
	spec.Volumes = []corev1.Volume{{Name: "varlog", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/log"}}}}
	meta.Annotations["handoff.dev/container"] = "worker"
	if _, err := inject.Pod(meta, spec, opts); err != nil {
		t.Fatal(err)
	}
	w := inject.Warnings(spec)
	want := []string{
		`spec.initContainers[setup] mounts the hostPath volume "varlog"`,
		`spec.containers[node-agent] is privileged`,
		`spec.containers[log-shipper] mounts the hostPath volume "varlog"`,
	}
	if len(w) != len(want) {
		t.Fatalf("warnings %q; want %d, one per container: %q", w, len(want), want)
	}
	for i := range want {
		if !strings.HasPrefix(w[i], want[i]) || !strings.Contains(w[i], "read the pod's handoff token") {
			t.Errorf("warning %d: %q; want it to begin %q and say what it may read", i, w[i], want[i])
		}
	}
}
