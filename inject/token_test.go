package inject_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
)

// automountedVolume is the token volume the API server's ServiceAccount
// admission plugin adds to a pod before the webhook sees it
// (kube-api-access-xxxxx, as in its TokenVolumeSource), and mounted into
// every container.
func automountedVolume() corev1.Volume {
	v := inject.TokenVolume()
	v.Name = "kube-api-access-x7k2p"
	v.Projected.Sources[0].ServiceAccountToken.ExpirationSeconds = ptr.To[int64](3607)
	return v
}

var automountedMount = corev1.VolumeMount{Name: "kube-api-access-x7k2p", MountPath: inject.TokenMountPath, ReadOnly: true}

// tokenMounts lists, per container of the pod, the volumes mounted at the
// token path, and checks nothing else mounts a token volume.
func tokenMounts(t *testing.T, spec *corev1.PodSpec) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, c := range append(append([]corev1.Container(nil), spec.InitContainers...), spec.Containers...) {
		for _, m := range c.VolumeMounts {
			if m.MountPath == inject.TokenMountPath {
				out[c.Name] = append(out[c.Name], m.Name)
			}
		}
	}
	return out
}

// An injected pod holds the service account token in the sidecar alone:
// no automount, the kubelet-like projected volume mounted into the sidecar
// where client-go's in-cluster configuration reads it, and, for a pod the
// webhook sees after the ServiceAccount admission plugin, that plugin's
// volume and its mounts in the worker, another container and an init
// container taken out. A token volume of the pod's own stays.
func TestOnlyTheSidecarHoldsTheToken(t *testing.T) {
	for _, layout := range []string{"native", "legacy"} {
		t.Run(layout, func(t *testing.T) {
			own := corev1.Volume{Name: "vault-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", Path: "token"}}}}}}
			meta, spec := pod(map[string]string{"handoff.dev/inject": "true", "handoff.dev/layout": layout},
				corev1.Container{Name: "worker", Image: "w", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, automountedMount}},
				corev1.Container{Name: "log-shipper", Image: "l", VolumeMounts: []corev1.VolumeMount{automountedMount, {Name: "vault-token", MountPath: "/vault"}}})
			spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "m", VolumeMounts: []corev1.VolumeMount{automountedMount}}}
			spec.Volumes = []corev1.Volume{{Name: "data"}, automountedVolume(), own}
			if _, err := inject.Pod(meta, spec, opts); err != nil {
				t.Fatal(err)
			}
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Errorf("spec.automountServiceAccountToken %v; want false", spec.AutomountServiceAccountToken)
			}
			want := map[string][]string{inject.SidecarName: {inject.TokenVolumeName}}
			if got := tokenMounts(t, spec); !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("token mounts by container %v; want %v", got, want)
			}
			var names []string
			for _, v := range spec.Volumes {
				names = append(names, v.Name)
				if v.Name == inject.TokenVolumeName && !equality.Semantic.DeepEqual(v, inject.TokenVolume()) {
					t.Errorf("volume %s: %+v; want %+v", v.Name, v, inject.TokenVolume())
				}
			}
			if got := strings.Join(names, ","); got != "data,vault-token,handoff-bin,handoff-run,handoff-api-token" {
				t.Errorf("volumes %s; want data,vault-token,handoff-bin,handoff-run,handoff-api-token", got)
			}
			if m := spec.Containers[0].VolumeMounts; len(m) != 3 || m[0].Name != "data" || m[1].Name != inject.VolumeName || m[2].Name != inject.RunVolumeName {
				t.Errorf("worker mounts %+v; want data, %s and %s", m, inject.VolumeName, inject.RunVolumeName)
			}
			if m := spec.Containers[1].VolumeMounts; len(m) != 1 || m[0].Name != "vault-token" {
				t.Errorf("log-shipper mounts %+v; want its own vault-token alone", m)
			}
			if got := inject.Warnings(spec); len(got) != 0 {
				t.Errorf("warnings %q; want none", got)
			}
		})
	}
}

// The projected token is the kubelet's layout, bound to the API server's
// default audience (no audience), expiring in an hour: not 3607 s, which
// the API server stretches to a year.
func TestTokenVolume(t *testing.T) {
	v := inject.TokenVolume()
	src := v.Projected.Sources
	if len(src) != 3 || src[0].ServiceAccountToken == nil || src[0].ServiceAccountToken.Path != "token" ||
		src[0].ServiceAccountToken.Audience != "" || ptr.Deref(src[0].ServiceAccountToken.ExpirationSeconds, 0) != 3600 {
		t.Fatalf("token source %+v; want token at path token, default audience, 3600 s", src)
	}
	if c := src[1].ConfigMap; c == nil || c.Name != "kube-root-ca.crt" || len(c.Items) != 1 || c.Items[0] != (corev1.KeyToPath{Key: "ca.crt", Path: "ca.crt"}) {
		t.Errorf("CA source %+v; want kube-root-ca.crt's ca.crt at ca.crt", src[1])
	}
	if d := src[2].DownwardAPI; d == nil || len(d.Items) != 1 || d.Items[0].Path != "namespace" || d.Items[0].FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("namespace source %+v; want metadata.namespace at namespace", src[2])
	}
}

// A pod that asks for the token everywhere keeps it as Kubernetes mounts
// it (the sidecar included), with a warning that says so.
func TestTokenInEveryContainerWhenAsked(t *testing.T) {
	meta, spec := pod(map[string]string{"handoff.dev/inject": "true"},
		corev1.Container{Name: "worker", Image: "w", VolumeMounts: []corev1.VolumeMount{automountedMount}})
	spec.Volumes = []corev1.Volume{automountedVolume()}
	spec.AutomountServiceAccountToken = ptr.To(true)
	if _, err := inject.Pod(meta, spec, opts); err != nil {
		t.Fatal(err)
	}
	if !*spec.AutomountServiceAccountToken {
		t.Error("spec.automountServiceAccountToken changed to false")
	}
	if got := tokenMounts(t, spec); len(got) != 1 || len(got["worker"]) != 1 {
		t.Errorf("token mounts %v; want the worker's, as it was (the API server mounts it into the sidecar)", got)
	}
	for _, v := range spec.Volumes {
		if v.Name == inject.TokenVolumeName {
			t.Errorf("volume %s added; want the API server's alone", v.Name)
		}
	}
	w := inject.Warnings(spec)
	if len(w) != 1 || !strings.Contains(w[0], "spec.automountServiceAccountToken true: every container of the pod holds the service account's token") {
		t.Errorf("warnings %q; want one on spec.automountServiceAccountToken true", w)
	}
}

// The token volume's name taken is refused, naming it.
func TestTokenVolumeNameTaken(t *testing.T) {
	meta, spec := pod(map[string]string{"handoff.dev/inject": "true"})
	spec.Volumes = []corev1.Volume{{Name: inject.TokenVolumeName}}
	_, err := inject.Pod(meta, spec, opts)
	if err == nil || !strings.Contains(err.Error(), `spec.volumes: the pod already has a volume named "handoff-api-token"`) {
		t.Errorf("error %v; want the volume name named", err)
	}
	if r := inject.Reasons(err); len(r) != 1 || r[0] != inject.ReasonNameTaken {
		t.Errorf("reasons %v; want [%s]", r, inject.ReasonNameTaken)
	}
}
