package inject

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// The service account token: the sidecar alone holds one.
const (
	// TokenVolumeName is the projected volume with the sidecar's service
	// account token, mounted into the sidecar container alone.
	TokenVolumeName = "handoff-api-token"
	// TokenMountPath is where the sidecar mounts it: the path the kubelet
	// mounts a pod's token at, where client-go's in-cluster configuration
	// (rest.InClusterConfig) reads token, ca.crt and namespace.
	TokenMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	// TokenExpirationSeconds is the lifetime the sidecar's token is asked
	// for, in seconds: 1 h. The kubelet replaces the file once the token is
	// past 80% of it (48 min), and client-go reads the file again at most a
	// minute after (transport.NewCachedFileTokenSource), so the sidecar
	// never sends an expired token. Not the kubelet's own 3607: the API
	// server (--service-account-extend-token-expiration, on by default)
	// makes a token asked for with exactly 3607 s valid for a year.
	TokenExpirationSeconds = 3600

	// automountedPrefix begins the name of the volume the API server's
	// ServiceAccount admission plugin adds to a pod that does not turn the
	// token off (kube-api-access-xxxxx), mounted at TokenMountPath into
	// every container. The plugin runs before the mutating webhooks, so the
	// webhook sees it.
	automountedPrefix = "kube-api-access-"
	// defaultServiceAccount is the service account of a pod that names
	// none.
	defaultServiceAccount = "default"
)

// apiToken gives the sidecar container the pod's service account token and
// no other container of the pod, unless the pod asks for the token in
// every container (spec.automountServiceAccountToken true: then it is left
// to Kubernetes, which mounts it into every container, the sidecar
// included). Otherwise it sets spec.automountServiceAccountToken false, so
// that the API server mounts the token nowhere, removes the volume the
// ServiceAccount admission plugin already added (the webhook sees the pod
// after it) and its mounts, and mounts TokenVolume into sidecar at
// TokenMountPath. A pod that names no service account is given the
// namespace's "default", as the ServiceAccount admission plugin does (the
// API server refuses a projected token without one). A token volume of the pod's own, under another name, is
// left as it is.
func apiToken(spec *corev1.PodSpec, sidecar *corev1.Container) {
	if ptr.Deref(spec.AutomountServiceAccountToken, false) {
		return
	}
	spec.AutomountServiceAccountToken = ptr.To(false)
	if spec.ServiceAccountName == "" && spec.DeprecatedServiceAccount == "" {
		// The API server refuses a projected token without it; its
		// ServiceAccount admission plugin sets the same on create.
		spec.ServiceAccountName = defaultServiceAccount
	}
	var dropped []string
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool {
		if automounted(v) {
			dropped = append(dropped, v.Name)
			return true
		}
		return false
	})
	unmount := func(cs []corev1.Container) {
		for i := range cs {
			cs[i].VolumeMounts = slices.DeleteFunc(cs[i].VolumeMounts, func(m corev1.VolumeMount) bool {
				return slices.Contains(dropped, m.Name)
			})
		}
	}
	unmount(spec.InitContainers)
	unmount(spec.Containers)
	spec.Volumes = append(spec.Volumes, TokenVolume())
	sidecar.VolumeMounts = append(sidecar.VolumeMounts, corev1.VolumeMount{Name: TokenVolumeName, MountPath: TokenMountPath, ReadOnly: true})
}

// automounted reports whether v is the token volume of the ServiceAccount
// admission plugin: named kube-api-access-xxxxx, projecting a service
// account token.
func automounted(v corev1.Volume) bool {
	if !strings.HasPrefix(v.Name, automountedPrefix) || v.Projected == nil {
		return false
	}
	return slices.ContainsFunc(v.Projected.Sources, func(s corev1.VolumeProjection) bool { return s.ServiceAccountToken != nil })
}

// TokenVolume is the sidecar's token volume, laid out as the kubelet's own
// (the ServiceAccount admission plugin's kube-api-access-xxxxx): the
// service account token for the API server's default audience, expiring
// after TokenExpirationSeconds, at token; the cluster's CA (the
// kube-root-ca.crt ConfigMap that kube-controller-manager publishes in
// every namespace) at ca.crt; the pod's namespace at namespace. The API
// server binds the token to the pod: it names the pod in every request
// (user extra authentication.kubernetes.io/pod-name and pod-uid, which the
// chart's admission policies check) and stops accepting it once the pod is
// gone.
func TokenVolume() corev1.Volume {
	return corev1.Volume{Name: TokenVolumeName, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To[int32](corev1.ProjectedVolumeSourceDefaultMode),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](TokenExpirationSeconds)}},
			{ConfigMap: &corev1.ConfigMapProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
			}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{
				Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"},
			}}}},
		},
	}}}
}

// tokenConflicts refuses a pod that already has a volume named
// TokenVolumeName.
func tokenConflicts(spec *corev1.PodSpec) error {
	for _, v := range spec.Volumes {
		if v.Name == TokenVolumeName {
			return refuse(ReasonNameTaken, fmt.Errorf("spec.volumes: the pod already has a volume named %q; rename it (handoff mounts the sidecar's service account token from it)", TokenVolumeName))
		}
	}
	return nil
}

// Warnings returns what an operator should know about a pod Pod has
// injected, one sentence each, for the admission response's warnings and
// `handoff inject`'s standard error; none for most pods. A pod with
// spec.automountServiceAccountToken true gets one: every container of it
// holds the service account's token, not only the sidecar.
func Warnings(spec *corev1.PodSpec) []string {
	var out []string
	if ptr.Deref(spec.AutomountServiceAccountToken, false) {
		out = append(out, "spec.automountServiceAccountToken true: every container of the pod holds the service account's token, and so may do what the handoff sidecar's Role allows (hold the workload's Leases, read its pods); remove the field to give the token to the handoff sidecar alone")
	}
	return out
}
