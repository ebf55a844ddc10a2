// Package client is bin/handoff-sidecar's version command, the client's
// version alone, and the report that both binaries' version commands print
// (bin/handoff's, internal/cli/version, adds the cluster's). It reads no
// cluster, so the sidecar's build links none of what that needs.
package client

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/version"
)

// Command is bin/handoff-sidecar's version command: the client's version as
// bin/handoff's `handoff version --client` prints it, with the same
// --output.
var Command = command.Command{
	Use:   "version [flags]",
	Short: "Print the handoff version",
	Long:  "Print the handoff version",
	Setup: func(fs *pflag.FlagSet) func(command.Invocation) error {
		fs.Bool("client", true, "print the client's version only (this build has no other)")
		format := fs.StringP("output", "o", "", "json or yaml; text without it")
		return func(inv command.Invocation) error {
			return Write(inv.Out, Report{Client: version.GetInfo()}, *format)
		}
	},
}

// Report is what `handoff version` prints: with -o json (or yaml)
// exactly this shape, documented in the command's help (the version command's help). Both
// builds print its client part alike.
type Report struct {
	Client version.Info `json:"client"`
	// Cluster is nil with --client (and in bin/handoff-sidecar).
	Cluster *Cluster `json:"cluster,omitempty"`
}

// Cluster is what the cluster runs, as far as it could be read.
type Cluster struct {
	// Reachable is whether the API server answered within --timeout; when
	// not, Error says why and nothing else is set.
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	// Kubernetes is the API server's version, like v1.35.4.
	Kubernetes string `json:"kubernetesVersion,omitempty"`
	// Webhook and Sidecars are set when Reachable.
	Webhook  *PodVersions `json:"webhook,omitempty"`
	Sidecars *PodVersions `json:"sidecars,omitempty"`
}

// PodVersions counts pods by the version they run.
type PodVersions struct {
	// Namespace is the namespace looked in, "" for all.
	Namespace string `json:"namespace"`
	// Selector is the label selector of the pods counted.
	Selector string `json:"selector"`
	// Versions are the versions found, newest first, "unknown" last;
	// empty (never null) when no pod was found.
	Versions []VersionCount `json:"versions"`
	// Error says why the pods could not be listed (then Versions is empty).
	Error string `json:"error,omitempty"`
}

// VersionCount is the number of pods that run one version.
type VersionCount struct {
	Version string `json:"version"`
	Pods    int    `json:"pods"`
}

// Write prints r as format: "" (text), "json" or "yaml".
func Write(w io.Writer, r Report, format string) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(r)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case "":
	default:
		return fmt.Errorf("--output %q: want json or yaml, or none for text", format)
	}
	c := r.Client
	var about []string
	if c.Commit != "" {
		about = append(about, "commit "+c.Commit[:min(len(c.Commit), 12)])
	}
	about = append(about, c.GoVersion, c.Platform)
	fmt.Fprintf(w, "Client version: %s (%s)\n", c.Version, strings.Join(about, ", "))
	if r.Cluster == nil {
		return nil
	}
	if !r.Cluster.Reachable {
		fmt.Fprintf(w, "Cluster: unreachable, so only the client's version is known: %s\n", r.Cluster.Error)
		return nil
	}
	fmt.Fprintf(w, "Kubernetes version: %s\n", r.Cluster.Kubernetes)
	fmt.Fprintf(w, "Webhook versions: %s\n", r.Cluster.Webhook.Text("webhook pods"))
	fmt.Fprintf(w, "Sidecar versions: %s\n", r.Cluster.Sidecars.Text("injected pods"))
	return nil
}

// Text is p in one line: "v0.2.0 (2 pods), unknown (1 pod) in all
// namespaces", or what was not found or could not be read.
func (p *PodVersions) Text(what string) string {
	where := "in all namespaces"
	if p.Namespace != "" {
		where = "in namespace " + p.Namespace
	}
	switch {
	case p.Error != "":
		return fmt.Sprintf("cannot tell: %s", p.Error)
	case len(p.Versions) == 0:
		return fmt.Sprintf("no %s %s (label selector %s)", what, where, p.Selector)
	}
	var parts []string
	for _, v := range p.Versions {
		unit := "pods"
		if v.Pods == 1 {
			unit = "pod"
		}
		parts = append(parts, fmt.Sprintf("%s (%d %s)", v.Version, v.Pods, unit))
	}
	return strings.Join(parts, ", ") + " " + where
}
