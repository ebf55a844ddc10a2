package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/handoff-dev/handoff/version"
)

// versionReport is what `handoff version` prints: with -o json (or yaml)
// exactly this shape, documented in the command's help (versionLong). Both
// builds print its client part alike.
type versionReport struct {
	Client version.Info `json:"client"`
	// Cluster is nil with --client (and in bin/handoff-sidecar).
	Cluster *clusterVersions `json:"cluster,omitempty"`
}

// clusterVersions is what the cluster runs, as far as it could be read.
type clusterVersions struct {
	// Reachable is whether the API server answered within --timeout; when
	// not, Error says why and nothing else is set.
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	// Kubernetes is the API server's version, like v1.35.4.
	Kubernetes string `json:"kubernetesVersion,omitempty"`
	// Webhook and Sidecars are set when Reachable.
	Webhook  *podVersions `json:"webhook,omitempty"`
	Sidecars *podVersions `json:"sidecars,omitempty"`
}

// podVersions counts pods by the version they run.
type podVersions struct {
	// Namespace is the namespace looked in, "" for all.
	Namespace string `json:"namespace"`
	// Selector is the label selector of the pods counted.
	Selector string `json:"selector"`
	// Versions are the versions found, newest first, unknownVersion last;
	// empty (never null) when no pod was found.
	Versions []versionCount `json:"versions"`
	// Error says why the pods could not be listed (then Versions is empty).
	Error string `json:"error,omitempty"`
}

// versionCount is the number of pods that run one version.
type versionCount struct {
	Version string `json:"version"`
	Pods    int    `json:"pods"`
}

// unknownVersion stands for the version of a pod that carries none: a pod
// injected before handoff.dev/version existed, or a webhook pod with
// neither the label app.kubernetes.io/version nor an image tag.
const unknownVersion = "unknown"

// writeVersion prints r as format: "" (text), "json" or "yaml".
func writeVersion(w io.Writer, r versionReport, format string) error {
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
	fmt.Fprintf(w, "Webhook versions: %s\n", r.Cluster.Webhook.text("webhook pods"))
	fmt.Fprintf(w, "Sidecar versions: %s\n", r.Cluster.Sidecars.text("injected pods"))
	return nil
}

// text is p in one line: "v0.2.0 (2 pods), unknown (1 pod) in all
// namespaces", or what was not found or could not be read.
func (p *podVersions) text(what string) string {
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
