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
// TokenMountPath. Only the plugin's volume is removed
// (admissionPluginVolume), and only from a pod that did not set
// spec.automountServiceAccountToken false (which the plugin honours): a
// volume of the pod's own named kube-api-access-* is kept, and Warnings
// names it. A pod that names no service account is given the
// namespace's "default", as the ServiceAccount admission plugin does (the
// API server refuses a projected token without one). A token volume of the pod's own, under another name, is
// left as it is.
func apiToken(spec *corev1.PodSpec, sidecar *corev1.Container) {
	if ptr.Deref(spec.AutomountServiceAccountToken, false) {
		return
	}
	// A pod that turned the token off got no volume from the ServiceAccount
	// admission plugin: every token volume it has is its own.
	ownOnly := spec.AutomountServiceAccountToken != nil
	spec.AutomountServiceAccountToken = ptr.To(false)
	if spec.ServiceAccountName == "" && spec.DeprecatedServiceAccount == "" {
		// The API server refuses a projected token without it; its
		// ServiceAccount admission plugin sets the same on create.
		spec.ServiceAccountName = defaultServiceAccount
	}
	var dropped []string
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool {
		if !ownOnly && admissionPluginVolume(v) {
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

// admissionPluginVolume reports whether v is the token volume of the
// ServiceAccount admission plugin, as it makes one: named
// kube-api-access-xxxxx (five random characters), projecting the service
// account token for the API server's audience at token, the cluster's CA
// from kube-root-ca.crt, and the namespace, nothing else. A token volume of
// the pod's own, under another name or of another shape, is not.
func admissionPluginVolume(v corev1.Volume) bool {
	if !automounted(v) || len(v.Name) != len(automountedPrefix)+5 || len(v.Projected.Sources) != 3 {
		return false
	}
	src := v.Projected.Sources
	return src[0].ServiceAccountToken != nil && src[0].ServiceAccountToken.Path == "token" && src[0].ServiceAccountToken.Audience == "" &&
		src[1].ConfigMap != nil && src[1].ConfigMap.Name == "kube-root-ca.crt" &&
		src[2].DownwardAPI != nil
}

// automounted reports whether v is named like the token volume of the
// ServiceAccount admission plugin (kube-api-access-*) and projects a
// service account token.
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

// Token file modes the install step is given (handoff install
// --token-mode).
const (
	// tokenModeOwnerGroup: readable by the file's owner and group alone.
	tokenModeOwnerGroup = "0440"
	// tokenModeAll: readable by every user of the containers that mount
	// it, when the worker's user is not known at admission.
	tokenModeAll = "0444"
)

// tokenFileAccess chooses who may read the pod's token file, which the
// install step writes and the sidecar (user and group 65532 by default,
// Options.RunAsUser and RunAsGroup) and the worker
// read: the user the install step runs as (the file's owner) and the mode.
//
//   - The worker's user is known (its container's securityContext.runAsUser,
//     else the pod's) and is not root: install runs as that user, group
//     65532, and the file is 0440: the worker reads it as its owner, the
//     sidecar through its group, no other user of the worker container.
//   - Else the pod sets securityContext.fsGroup: install runs as 65532 and
//     the file is 0440 in the handoff-bin emptyDir, which the kubelet gives
//     the fsGroup (setgid): the sidecar reads it as its owner, the worker
//     through the fsGroup, which the kubelet adds to its supplementary
//     groups.
//   - Else (the image's USER decides, unknown here, or root): install runs
//     as 65532 and the file is 0444, readable by every user of the worker
//     container (it was 0644); docs/security.md says what to set.
//
// uid is nil when neither the worker's user is known nor the injector has
// one (Options.RunAsUser OmitID): install then runs as the user the
// platform assigns, which is the sidecar's too (OpenShift gives every
// container of a pod the same one), and the modes above hold with it.
func tokenFileAccess(spec *corev1.PodSpec, worker corev1.Container, injector *int64) (uid *int64, mode string) {
	var user *int64
	if worker.SecurityContext != nil {
		user = worker.SecurityContext.RunAsUser
	}
	if user == nil && spec.SecurityContext != nil {
		user = spec.SecurityContext.RunAsUser
	}
	switch {
	case user != nil && *user != 0:
		return user, tokenModeOwnerGroup
	case spec.SecurityContext != nil && spec.SecurityContext.FSGroup != nil:
		return injector, tokenModeOwnerGroup
	}
	return injector, tokenModeAll
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
//
// Others: a container that mounts a service account token volume of the pod's own named like
// the API server's (kube-api-access-*), which injection keeps; and a
// container, other than handoff's and the worker, that is privileged or
// mounts a hostPath volume: either can reach the node's copy of the pod's
// volumes, the token and the sockets included.
func Warnings(spec *corev1.PodSpec) []string {
	var out []string
	if ptr.Deref(spec.AutomountServiceAccountToken, false) {
		out = append(out, "spec.automountServiceAccountToken true: every container of the pod holds the service account's token, and so may do what the handoff sidecar's Role allows (hold the workload's Leases, read its pods); remove the field to give the token to the handoff sidecar alone")
	}
	hostPaths := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = true
		}
	}
	for _, v := range spec.Volumes {
		if automounted(v) && !ptr.Deref(spec.AutomountServiceAccountToken, false) {
			out = append(out, fmt.Sprintf("spec.volumes[%s]: a service account token volume of the pod's own, named like the one the API server adds; handoff keeps it, and every container that mounts it holds API credentials, not only the handoff sidecar", v.Name))
		}
	}
	for _, list := range []struct {
		field      string
		containers []corev1.Container
	}{{"spec.initContainers", spec.InitContainers}, {"spec.containers", spec.Containers}} {
		for _, c := range list.containers {
			if c.Name == InstallName || c.Name == SidecarName || mountsVolume(c, RunVolumeName) {
				continue // handoff's own, or the worker: they hold the token anyway
			}
			var why []string
			if c.SecurityContext != nil && ptr.Deref(c.SecurityContext.Privileged, false) {
				why = append(why, "is privileged")
			}
			for _, m := range c.VolumeMounts {
				if hostPaths[m.Name] {
					why = append(why, fmt.Sprintf("mounts the hostPath volume %q", m.Name))
				}
			}
			if len(why) > 0 {
				out = append(out, fmt.Sprintf("%s[%s] %s: it may reach the node's copy of the pod's volumes, and so read the pod's handoff token and use its sockets; run such a container in another pod", list.field, c.Name, strings.Join(why, " and ")))
			}
		}
	}
	return out
}

// mountsVolume reports whether c mounts the volume named name.
func mountsVolume(c corev1.Container, name string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == name })
}
