// Package injectflags are the injector's flags, which the inject and the
// webhook commands share: the sidecar's image and resources.
package injectflags

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/version"
)

// SidecarRepository is the image that injected pods run, which a release
// publishes tagged with its version (the webhook and the CLI are
// ghcr.io/handoff-dev/handoff).
const SidecarRepository = "ghcr.io/handoff-dev/handoff-sidecar"

// DefaultImage is the sidecar image of this build's release:
// SidecarRepository tagged with version.Get(), like
// ghcr.io/handoff-dev/handoff-sidecar:v0.2.0. A development build's
// version names an image no registry has (ImageUsage says so).
func DefaultImage() string { return SidecarRepository + ":" + version.Get() }

// ImageUsage is the help of --image.
func ImageUsage() string {
	u := "handoff sidecar image for the sidecar and its install step; by default the release's of this build's version"
	if v := version.Get(); !version.Released(v) {
		u += ", but " + v + " is a development build, whose image no registry publishes: give the image you built"
	}
	return u
}

// Flags are the injector's settings, shared by inject and webhook.
type Flags struct {
	image, pullPolicy          string
	cpuRequest, cpuLimit       string
	memoryRequest, memoryLimit string
	runAsUser, runAsGroup      string
}

// Add adds the flags to fs: --image, --image-pull-policy and the
// sidecar's resources.
func (f *Flags) Add(fs *pflag.FlagSet) {
	fs.StringVar(&f.image, "image", DefaultImage(), ImageUsage())
	fs.StringVar(&f.pullPolicy, "image-pull-policy", string(corev1.PullIfNotPresent), "Always, IfNotPresent or Never")
	fs.StringVar(&f.cpuRequest, "sidecar-cpu-request", "10m", "CPU request of the sidecar (a quantity, or empty for none)")
	fs.StringVar(&f.cpuLimit, "sidecar-cpu-limit", "", "CPU limit of the sidecar (a quantity, or empty for none)")
	fs.StringVar(&f.memoryRequest, "sidecar-memory-request", "48Mi", "memory request of the sidecar (a quantity, or empty for none)")
	fs.StringVar(&f.memoryLimit, "sidecar-memory-limit", "128Mi", "memory limit of the sidecar (a quantity, or empty for none)")
	fs.StringVar(&f.runAsUser, "sidecar-run-as-user", "65532", "user id the sidecar and its install step run as (from 1), or empty to leave runAsUser out for a platform that assigns one (OpenShift restricted-v2); runAsNonRoot stays true")
	fs.StringVar(&f.runAsGroup, "sidecar-run-as-group", "65532", "group id the sidecar and its install step run as (from 1), or empty to leave runAsGroup out")
}

// Options are the injector's options the flags give; the error names
// every flag whose value is wrong.
func (f *Flags) Options() (inject.Options, error) {
	o := inject.Options{Image: f.image, ImagePullPolicy: corev1.PullPolicy(f.pullPolicy),
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}}
	var errs []error
	switch o.ImagePullPolicy {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, fmt.Errorf("--image-pull-policy %q: want Always, IfNotPresent or Never", f.pullPolicy))
	}
	if f.image == "" {
		errs = append(errs, fmt.Errorf("--image: want an image reference, like %s", DefaultImage()))
	}
	for _, q := range []struct {
		flag, value string
		list        corev1.ResourceList
		name        corev1.ResourceName
	}{
		{"--sidecar-cpu-request", f.cpuRequest, o.Resources.Requests, corev1.ResourceCPU},
		{"--sidecar-cpu-limit", f.cpuLimit, o.Resources.Limits, corev1.ResourceCPU},
		{"--sidecar-memory-request", f.memoryRequest, o.Resources.Requests, corev1.ResourceMemory},
		{"--sidecar-memory-limit", f.memoryLimit, o.Resources.Limits, corev1.ResourceMemory},
	} {
		if q.value == "" {
			continue
		}
		v, err := resource.ParseQuantity(q.value)
		if err != nil || v.Sign() < 0 {
			errs = append(errs, fmt.Errorf("%s %q: want a quantity from 0, like 10m or 64Mi", q.flag, q.value))
			continue
		}
		q.list[q.name] = v
	}
	// The API server refuses a container whose request is above its limit.
	if req, ok := o.Resources.Requests[corev1.ResourceMemory]; ok {
		if lim, ok := o.Resources.Limits[corev1.ResourceMemory]; ok && req.Cmp(lim) > 0 {
			errs = append(errs, fmt.Errorf("--sidecar-memory-request %s is above --sidecar-memory-limit %s: want a request at most the limit", f.memoryRequest, f.memoryLimit))
		}
	}
	if req, ok := o.Resources.Requests[corev1.ResourceCPU]; ok {
		if lim, ok := o.Resources.Limits[corev1.ResourceCPU]; ok && req.Cmp(lim) > 0 {
			errs = append(errs, fmt.Errorf("--sidecar-cpu-request %s is above --sidecar-cpu-limit %s: want a request at most the limit", f.cpuRequest, f.cpuLimit))
		}
	}
	var err error
	if o.RunAsUser, err = parseID("--sidecar-run-as-user", f.runAsUser); err != nil {
		errs = append(errs, err)
	}
	if o.RunAsGroup, err = parseID("--sidecar-run-as-group", f.runAsGroup); err != nil {
		errs = append(errs, err)
	}
	return o, errors.Join(errs...)
}

// parseID reads a user or group id flag: "" is inject.OmitID, else a
// number from 1 to 2147483647 (0 is root's, which a non-root sidecar does
// not run as).
func parseID(flag, v string) (int64, error) {
	if v == "" {
		return inject.OmitID, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 || n > math.MaxInt32 {
		return 0, fmt.Errorf("%s %q: want a number from 1 to %d, or empty to leave it out for the platform to assign (OpenShift restricted-v2)",
			flag, v, math.MaxInt32)
	}
	return n, nil
}
