// Package version is bin/handoff's version command: the client's version
// and, unless --client is given, what the cluster runs (Kubernetes, the
// webhook and the injected sidecars). bin/handoff-sidecar's is
// internal/cli/version/client, which reads no cluster.
package version

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/mod/semver"
	"k8s.io/apimachinery/pkg/labels"
	kversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/kube"
	"github.com/handoff-dev/handoff/internal/cli/version/client"
	"github.com/handoff-dev/handoff/version"
)

const versionLong = `version prints the version of this handoff binary (the client) and, unless
--client is given, what the cluster of the kubeconfig's current context runs:
its Kubernetes version, and the versions of the handoff webhook and of the
injected sidecars, each as a count of pods per version. All have one form,
the release's git tag (v0.2.0), or a pre-release for a build between tags
(v0.2.1-dev.3.g1a2b3c4).

The kubeconfig is read as kubectl reads it: --kubeconfig, else KUBECONFIG,
else ~/.kube/config, else the in-cluster configuration; --context picks a
context. Everything the cluster is asked is asked within --timeout in all. A
cluster that cannot be reached, or pods that the credentials may not list,
make a line of the output that says so, not a failure: the command fails only
for a wrong flag.

  webhook   the pods --webhook-selector selects (the chart's webhook pods),
            in --webhook-namespace or every namespace; a pod's version is
            its label app.kubernetes.io/version, else its webhook container's
            image tag, else "unknown".
  sidecars  the injected pods (label handoff.dev/injected=true) that have not
            finished, in -n's namespace or every namespace; a pod's version
            is its annotation handoff.dev/version, "unknown" on a pod
            injected before handoff wrote it there. The label
            handoff.dev/version carries the same: kubectl get pods -A -l
            'handoff.dev/injected,handoff.dev/version!=v0.2.0' lists the pods
            whose sidecars are not v0.2.0.

Versions are listed newest first (semantic version order), "unknown" last.
Listing pods needs list on pods in the namespaces looked in.

With -o json this shape, which stays as it is (yaml: the same fields):

  {
    "client": {
      "version": "v0.2.0",
      "commit": "<git commit; absent when unknown>",
      "goVersion": "go1.27.3",
      "platform": "linux/amd64"
    },
    "cluster": {                        <absent with --client>
      "reachable": true,
      "error": "<why not reachable; only then, and nothing below>",
      "kubernetesVersion": "v1.35.4",
      "webhook": {
        "namespace": "<\"\" for every namespace>",
        "selector": "app.kubernetes.io/part-of=handoff,app.kubernetes.io/component=webhook",
        "versions": [{"version": "v0.2.0", "pods": 2}],
        "error": "<why the pods could not be listed; then versions is []>"
      },
      "sidecars": {
        "namespace": "",
        "selector": "handoff.dev/injected=true",
        "versions": [{"version": "v0.2.0", "pods": 5}, {"version": "unknown", "pods": 1}]
      }
    }
  }`

// Command is bin/handoff's version command.
var Command = command.Command{
	Use:   "version",
	Short: "Print the handoff version of this client, and of the webhook and the sidecars in the cluster",
	Long:  versionLong,
	Setup: func(f *pflag.FlagSet) func(command.Invocation) error {
		var (
			clientOnly                            bool
			format, kubeconfig, kubeContext       string
			namespace, webhookNamespace, selector string
			timeout                               time.Duration
		)
		f.BoolVar(&clientOnly, "client", false, "print the client's version only, without reading the cluster")
		f.StringVarP(&format, "output", "o", "", "json or yaml (the shape above); text without it")
		f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty: KUBECONFIG, else ~/.kube/config, else in-cluster, as kubectl")
		f.StringVar(&kubeContext, "context", "", "kubeconfig context; empty: the current one")
		f.DurationVar(&timeout, "timeout", 5*time.Second, "how long the cluster may take to answer, in all; past it, it is reported unreachable")
		f.StringVarP(&namespace, "namespace", "n", "", "namespace of the injected pods to count; empty: every namespace")
		f.StringVar(&webhookNamespace, "webhook-namespace", "", "namespace of the webhook; empty: every namespace")
		f.StringVar(&selector, "webhook-selector", kube.WebhookSelector, "label selector of the webhook's pods")
		return func(inv command.Invocation) error {
			var errs []error
			if format != "" && format != "json" && format != "yaml" {
				errs = append(errs, fmt.Errorf("--output %q: want json or yaml, or none for text", format))
			}
			if timeout <= 0 {
				errs = append(errs, fmt.Errorf("--timeout %s: want a duration above 0, like 5s", timeout))
			}
			if _, err := labels.Parse(selector); err != nil {
				errs = append(errs, fmt.Errorf("--webhook-selector %q: want a label selector, like %s: %w", selector, kube.WebhookSelector, err))
			}
			if kubeconfig != "" {
				if _, err := os.Stat(kubeconfig); err != nil {
					errs = append(errs, fmt.Errorf("--kubeconfig: want a kubeconfig file: %w", err))
				}
			}
			if err := errors.Join(errs...); err != nil {
				return err
			}
			r := client.Report{Client: version.GetInfo()}
			if !clientOnly {
				r.Cluster = readCluster(inv.Ctx, clusterQuery{kubeconfig: kubeconfig, context: kubeContext, timeout: timeout,
					namespace: namespace, webhookNamespace: webhookNamespace, webhookSelector: selector})
			}
			return client.Write(inv.Out, r, format)
		}
	},
}

// clusterQuery is where and how long readCluster looks.
type clusterQuery struct {
	kubeconfig, context string
	timeout             time.Duration
	// namespace is the injected pods', webhookNamespace the webhook's; ""
	// for every namespace.
	namespace, webhookNamespace, webhookSelector string
}

// readCluster reads the Kubernetes version, the webhook's and the
// sidecars' versions within q.timeout. It never fails: what it could not
// read is said in the result's Error fields.
func readCluster(ctx context.Context, q clusterQuery) *client.Cluster {
	ctx, cancel := context.WithTimeout(ctx, q.timeout)
	defer cancel()
	rc, _, err := kube.ClientConfig(q.kubeconfig, q.context, q.timeout)
	if err != nil {
		return &client.Cluster{Error: err.Error()}
	}
	unreachable := func(err error) *client.Cluster {
		// The client's own timeout (rc.Timeout) and ctx's end at the same
		// moment: either one is the --timeout running out.
		var ne net.Error
		if ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout()) {
			return &client.Cluster{Error: fmt.Sprintf("no answer from %s within %s (--timeout)", rc.Host, q.timeout)}
		}
		return &client.Cluster{Error: err.Error()}
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return unreachable(err)
	}
	raw, err := kc.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return unreachable(err)
	}
	var kv kversion.Info
	if err := json.Unmarshal(raw, &kv); err != nil {
		return unreachable(fmt.Errorf("%s/version: %w", rc.Host, err))
	}
	c := &client.Cluster{Reachable: true, Kubernetes: kv.GitVersion}
	c.Webhook = podVersions(q.webhookNamespace, q.webhookSelector)(kube.WebhookVersions(ctx, kc, q.webhookNamespace, q.webhookSelector))
	c.Sidecars = podVersions(q.namespace, kube.SidecarSelector)(nil, nil)
	if meta, err := metadata.NewForConfig(rc); err != nil {
		c.Sidecars.Error = err.Error()
	} else {
		c.Sidecars = podVersions(q.namespace, kube.SidecarSelector)(kube.SidecarVersions(ctx, meta, q.namespace))
	}
	return c
}

// podVersions makes the count of the pods in namespace ("" for all) that
// selector selects, from the counts by version or the error of their list.
func podVersions(namespace, selector string) func(counts map[string]int, err error) *client.PodVersions {
	return func(counts map[string]int, err error) *client.PodVersions {
		p := &client.PodVersions{Namespace: namespace, Selector: selector, Versions: sortedCounts(counts)}
		if err != nil {
			p.Error = err.Error()
		}
		return p
	}
}

// sortedCounts lists counts newest version first: semantic versions in
// their order, then other strings in theirs, then kube.UnknownVersion.
func sortedCounts(counts map[string]int) []client.VersionCount {
	out := make([]client.VersionCount, 0, len(counts))
	for v, n := range counts {
		out = append(out, client.VersionCount{Version: v, Pods: n})
	}
	rank := func(v string) int {
		switch {
		case v == kube.UnknownVersion:
			return 2
		case semver.IsValid(v):
			return 0
		}
		return 1
	}
	slices.SortFunc(out, func(a, b client.VersionCount) int {
		if ra, rb := rank(a.Version), rank(b.Version); ra != rb {
			return ra - rb
		}
		if c := semver.Compare(b.Version, a.Version); c != 0 {
			return c
		}
		return strings.Compare(a.Version, b.Version)
	})
	return out
}
