package webhook_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// On the real API server: an injected pod with a privileged container and
// one mounting a hostPath volume beside the worker, and a service account
// token volume of its own named kube-api-access-mine, is admitted with the
// volume and its mount kept, and its creator is warned of each (before: the
// volume was removed without a word, and no warning). The install step runs
// as the worker's runAsUser and writes the token 0440.
func TestInjectedPodKeepsItsOwnTokenVolumeAndWarns(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	var warned warnings
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = &warned

	own := corev1.Volume{Name: "kube-api-access-mine", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", Path: "token"}}}}}}
	p := newPod("neighbours", map[string]string{"handoff.dev/inject": "true", "handoff.dev/container": "worker"})
	p.Spec.AutomountServiceAccountToken = ptr.To(false)
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](1000)}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: own.Name, MountPath: "/var/run/secrets/vault", ReadOnly: true}}
	p.Spec.Containers = append(p.Spec.Containers,
		corev1.Container{Name: "node-agent", Image: "agent:1", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}},
		corev1.Container{Name: "log-shipper", Image: "shipper:1", VolumeMounts: []corev1.VolumeMount{{Name: "varlog", MountPath: "/var/log"}}})
	p.Spec.Volumes = []corev1.Volume{own, {Name: "varlog", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/log"}}}}

	got, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(got.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == own.Name }) {
		t.Errorf("volume %s removed; want it kept", own.Name)
	}
	if !slices.ContainsFunc(got.Spec.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == own.Name }) {
		t.Errorf("the worker's mount of %s removed; want it kept", own.Name)
	}
	all := strings.Join(warned.msgs, "\n")
	for _, want := range []string{
		"spec.volumes[kube-api-access-mine]: a service account token volume of the pod's own",
		"spec.containers[node-agent] is privileged",
		`spec.containers[log-shipper] mounts the hostPath volume "varlog"`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("warnings %q; want one saying %q", warned.msgs, want)
		}
	}
	for _, c := range got.Spec.InitContainers {
		if c.Name != inject.InstallName {
			continue
		}
		if u := ptr.Deref(c.SecurityContext.RunAsUser, -1); u != 1000 || !slices.Contains(c.Args, "0440") {
			t.Errorf("install runs as %d with %q; want the worker's user 1000 and --token-mode 0440", u, c.Args)
		}
	}
}
