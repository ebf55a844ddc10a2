// Package inject is the inject command: the admission webhook's injection
// applied to manifests, without a webhook.
package inject

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/spf13/pflag"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/injectflags"
)

// Command is the inject command.
var Command = command.Command{
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
	Setup: func(f *pflag.FlagSet) func(command.Invocation) error {
		var (
			files []string
			diff  bool
		)
		o := injectflags.Flags{}
		f.StringArrayVarP(&files, "filename", "f", nil, `manifest file to read, "-" for standard input (repeatable; default standard input)`)
		f.BoolVar(&diff, "diff", false, "print a unified diff of the change instead of the manifests")
		o.Add(f)
		return func(inv command.Invocation) error {
			opts, err := o.Options()
			if err != nil {
				return err
			}
			inputs, err := readInputs(inv.In, files)
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
					fmt.Fprintf(inv.ErrOut, "injected %s %s\n", c.Kind, c.Name)
					for _, w := range c.Warnings {
						fmt.Fprintf(inv.ErrOut, "warning: %s %s: %s\n", c.Kind, c.Name, w)
					}
				}
			}
			if !diff {
				_, err := out.WriteTo(inv.Out)
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
			return difflib.WriteUnifiedDiff(inv.Out, difflib.UnifiedDiff{
				A: difflib.SplitLines(before), B: difflib.SplitLines(after),
				FromFile: "before", ToFile: "injected", Context: 3,
			})
		}
	},
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
