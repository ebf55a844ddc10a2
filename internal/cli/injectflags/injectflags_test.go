package injectflags

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/version"
)

// The injector's default image is the sidecar image of this build's
// version, and a development build's --image help says that no registry
// has it.
func TestDefaultImageIsThisVersionsSidecar(t *testing.T) {
	if got, want := DefaultImage(), "ghcr.io/handoff-dev/handoff-sidecar:"+version.Get(); got != want {
		t.Errorf("default image %s, want %s", got, want)
	}
	if v := version.Get(); !version.Released(v) && !strings.Contains(ImageUsage(), v+" is a development build") {
		t.Errorf("--image help of the development build %s: %q; want it to say so", v, ImageUsage())
	}
}

// The sidecar's ids: 65532 by default, a number from 1, or empty to leave
// the field out; the CPU limit; anything else refused naming the flag.
func TestIDsAndCPULimitFlags(t *testing.T) {
	parse := func(args ...string) (inject.Options, error) {
		var f Flags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f.Add(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return f.Options()
	}
	o, err := parse()
	if err != nil || o.RunAsUser != 65532 || o.RunAsGroup != 65532 {
		t.Errorf("defaults: %d %d, %v; want 65532 65532", o.RunAsUser, o.RunAsGroup, err)
	}
	if _, ok := o.Resources.Limits[corev1.ResourceCPU]; ok {
		t.Errorf("default CPU limit %v; want none", o.Resources.Limits)
	}
	o, err = parse("--sidecar-run-as-user=", "--sidecar-run-as-group=", "--sidecar-cpu-limit=500m")
	if err != nil || o.RunAsUser != inject.OmitID || o.RunAsGroup != inject.OmitID || o.Resources.Limits.Cpu().String() != "500m" {
		t.Errorf("omitted ids, CPU limit: %d %d %v, %v; want OmitID twice and 500m", o.RunAsUser, o.RunAsGroup, o.Resources.Limits, err)
	}
	_, err = parse("--sidecar-run-as-user=0", "--sidecar-run-as-group=x", "--sidecar-cpu-limit=5m")
	for _, want := range []string{`--sidecar-run-as-user "0": want a number from 1`, `--sidecar-run-as-group "x"`, "--sidecar-cpu-request 10m is above --sidecar-cpu-limit 5m"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v; want it to say %q", err, want)
		}
	}
}
