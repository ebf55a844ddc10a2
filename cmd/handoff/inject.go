//go:build !sidecaronly

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/version"
)

func injectCommand() *cobra.Command {
	var (
		files []string
		diff  bool
	)
	o := injectFlags{}
	cmd := &cobra.Command{
		Use:   "inject [-f FILE]...",
		Short: "Add the handoff sidecar to the pod templates of manifests, without a webhook",
		Long: `inject reads YAML (or JSON) manifests, from the files given with -f or from
standard input, and writes them to standard output with the handoff sidecar
added to every Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job and
CronJob whose pod template has the label or the annotation
handoff.dev/inject: "true", exactly as the admission webhook would. Other documents are written as they
were read. If any object cannot be injected nothing is written and every
problem is reported. See docs/annotations.md.

  handoff inject -f deploy.yaml | kubectl apply -f -
  handoff inject --diff -f deploy.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := o.options()
			if err != nil {
				return err
			}
			inputs, err := readInputs(cmd.InOrStdin(), files)
			if err != nil {
				return err
			}
			// Each file on its own, so that an error's document and line
			// numbers are that file's; nothing is written if any fails.
			var in, out bytes.Buffer
			var changes []inject.Change
			var errs []error
			for i, f := range inputs {
				if i > 0 {
					in.WriteString("\n---\n")
					out.WriteString("---\n")
				}
				in.Write(f.data)
				cs, err := inject.Manifests(bytes.NewReader(f.data), &out, opts)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", f.name, err))
				}
				changes = append(changes, cs...)
			}
			if len(errs) > 0 {
				return errors.Join(errs...)
			}
			for _, c := range changes {
				if c.Result == inject.Injected {
					fmt.Fprintf(cmd.ErrOrStderr(), "injected %s %s\n", c.Kind, c.Name)
					for _, w := range c.Warnings {
						fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s %s: %s\n", c.Kind, c.Name, w)
					}
				}
			}
			if !diff {
				_, err := out.WriteTo(cmd.OutOrStdout())
				return err
			}
			before, err := normalized(in.Bytes())
			if err != nil {
				return err
			}
			after, err := normalized(out.Bytes())
			if err != nil {
				return err
			}
			return difflib.WriteUnifiedDiff(cmd.OutOrStdout(), difflib.UnifiedDiff{
				A: difflib.SplitLines(before), B: difflib.SplitLines(after),
				FromFile: "before", ToFile: "injected", Context: 3,
			})
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, `manifest file to read, "-" for standard input (repeatable; default standard input)`)
	cmd.Flags().BoolVar(&diff, "diff", false, "print a unified diff of the change instead of the manifests")
	o.add(cmd.Flags())
	return cmd
}

// normalized writes every document of a YAML stream the same way (sorted
// keys, block style, no comments), so a diff shows only what changed.
func normalized(stream []byte) (string, error) {
	r := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	var b strings.Builder
	for {
		var v any
		err := r.Decode(&v)
		if errors.Is(err, io.EOF) {
			return b.String(), nil
		}
		if err != nil {
			return "", err
		}
		if v == nil {
			continue
		}
		y, err := yaml.Marshal(v)
		if err != nil {
			return "", err
		}
		if b.Len() > 0 {
			b.WriteString("---\n")
		}
		b.Write(y)
	}
}

// input is one manifest file's bytes; name is its path, or "standard
// input" for "-".
type input struct {
	name string
	data []byte
}

// readInputs reads the -f files in order (standard input for "-", or when
// none is given).
func readInputs(stdin io.Reader, files []string) ([]input, error) {
	if len(files) == 0 {
		files = []string{"-"}
	}
	inputs := make([]input, 0, len(files))
	for _, f := range files {
		in := input{name: f}
		var err error
		if f == "-" {
			in.name = "standard input"
			in.data, err = io.ReadAll(stdin)
		} else {
			in.data, err = os.ReadFile(f)
		}
		if err != nil {
			return nil, err
		}
		inputs = append(inputs, in)
	}
	return inputs, nil
}

// sidecarRepository is the image that injected pods run, which a release
// publishes tagged with its version (the webhook and the CLI are
// ghcr.io/handoff-dev/handoff).
const sidecarRepository = "ghcr.io/handoff-dev/handoff-sidecar"

// defaultImage is the sidecar image of this build's release:
// sidecarRepository tagged with version.Get(), like
// ghcr.io/handoff-dev/handoff-sidecar:v0.2.0. A development build's
// version names an image no registry has (imageUsage says so).
func defaultImage() string { return sidecarRepository + ":" + version.Get() }

// imageUsage is the help of --image.
func imageUsage() string {
	u := "handoff sidecar image for the sidecar and its install step; by default the release's of this build's version"
	if v := version.Get(); !version.Released(v) {
		u += ", but " + v + " is a development build, whose image no registry publishes: give the image you built"
	}
	return u
}

// injectFlags are the injector's settings, shared by inject and webhook.
type injectFlags struct {
	image, pullPolicy                      string
	cpuRequest, memoryRequest, memoryLimit string
}

func (f *injectFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&f.image, "image", defaultImage(), imageUsage())
	fs.StringVar(&f.pullPolicy, "image-pull-policy", string(corev1.PullIfNotPresent), "Always, IfNotPresent or Never")
	fs.StringVar(&f.cpuRequest, "sidecar-cpu-request", "10m", "CPU request of the sidecar (a quantity, or empty for none)")
	fs.StringVar(&f.memoryRequest, "sidecar-memory-request", "48Mi", "memory request of the sidecar (a quantity, or empty for none)")
	fs.StringVar(&f.memoryLimit, "sidecar-memory-limit", "128Mi", "memory limit of the sidecar (a quantity, or empty for none)")
}

func (f *injectFlags) options() (inject.Options, error) {
	o := inject.Options{Image: f.image, ImagePullPolicy: corev1.PullPolicy(f.pullPolicy),
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}}
	var errs []error
	switch o.ImagePullPolicy {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, fmt.Errorf("--image-pull-policy %q: want Always, IfNotPresent or Never", f.pullPolicy))
	}
	if f.image == "" {
		errs = append(errs, fmt.Errorf("--image: want an image reference, like %s", defaultImage()))
	}
	for _, q := range []struct {
		flag, value string
		list        corev1.ResourceList
		name        corev1.ResourceName
	}{
		{"--sidecar-cpu-request", f.cpuRequest, o.Resources.Requests, corev1.ResourceCPU},
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
	return o, errors.Join(errs...)
}
