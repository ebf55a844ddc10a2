//go:build !sidecaronly

package main

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

	"github.com/spf13/cobra"
	"golang.org/x/mod/semver"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/version"
)

// Where `handoff version` looks in the cluster.
const (
	// webhookSelector selects the chart's webhook pods (its
	// labels: part-of and component, which nameOverride and the release name
	// leave as they are).
	webhookSelector = "app.kubernetes.io/part-of=handoff,app.kubernetes.io/component=webhook"
	// webhookVersionLabel is the label of a webhook pod that gives its
	// version (the chart sets it from its appVersion); without it, the
	// webhook container's image tag does.
	webhookVersionLabel = "app.kubernetes.io/version"
	// webhookContainer is the chart's name of the webhook's container.
	webhookContainer = "webhook"
	// notFinished leaves out the pods whose containers have all ended (a
	// Job's): they run no sidecar any more.
	notFinished = "status.phase!=Succeeded,status.phase!=Failed"
	// listPage is how many pods one list call returns at most.
	listPage = 500
)

// sidecarSelector selects the injected pods.
var sidecarSelector = inject.LabelInjected + "=true"

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

func versionCommand() *cobra.Command {
	var (
		client                                bool
		format, kubeconfig, kubeContext       string
		namespace, webhookNamespace, selector string
		timeout                               time.Duration
	)
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the handoff version of this client, and of the webhook and the sidecars in the cluster",
		Long:  versionLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var errs []error
			if format != "" && format != "json" && format != "yaml" {
				errs = append(errs, fmt.Errorf("--output %q: want json or yaml, or none for text", format))
			}
			if timeout <= 0 {
				errs = append(errs, fmt.Errorf("--timeout %s: want a duration above 0, like 5s", timeout))
			}
			if _, err := labels.Parse(selector); err != nil {
				errs = append(errs, fmt.Errorf("--webhook-selector %q: want a label selector, like %s: %w", selector, webhookSelector, err))
			}
			if kubeconfig != "" {
				if _, err := os.Stat(kubeconfig); err != nil {
					errs = append(errs, fmt.Errorf("--kubeconfig: want a kubeconfig file: %w", err))
				}
			}
			if err := errors.Join(errs...); err != nil {
				return err
			}
			r := versionReport{Client: version.GetInfo()}
			if !client {
				r.Cluster = readCluster(cmd.Context(), clusterQuery{kubeconfig: kubeconfig, context: kubeContext, timeout: timeout,
					namespace: namespace, webhookNamespace: webhookNamespace, webhookSelector: selector})
			}
			return writeVersion(cmd.OutOrStdout(), r, format)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&client, "client", false, "print the client's version only, without reading the cluster")
	f.StringVarP(&format, "output", "o", "", "json or yaml (the shape above); text without it")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty: KUBECONFIG, else ~/.kube/config, else in-cluster, as kubectl")
	f.StringVar(&kubeContext, "context", "", "kubeconfig context; empty: the current one")
	f.DurationVar(&timeout, "timeout", 5*time.Second, "how long the cluster may take to answer, in all; past it, it is reported unreachable")
	f.StringVarP(&namespace, "namespace", "n", "", "namespace of the injected pods to count; empty: every namespace")
	f.StringVar(&webhookNamespace, "webhook-namespace", "", "namespace of the webhook; empty: every namespace")
	f.StringVar(&selector, "webhook-selector", webhookSelector, "label selector of the webhook's pods")
	return cmd
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
func readCluster(ctx context.Context, q clusterQuery) *clusterVersions {
	ctx, cancel := context.WithTimeout(ctx, q.timeout)
	defer cancel()
	rc, _, err := kubeClientConfig(q.kubeconfig, q.context, q.timeout)
	if err != nil {
		return &clusterVersions{Error: err.Error()}
	}
	unreachable := func(err error) *clusterVersions {
		// The client's own timeout (rc.Timeout) and ctx's end at the same
		// moment: either one is the --timeout running out.
		var ne net.Error
		if ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout()) {
			return &clusterVersions{Error: fmt.Sprintf("no answer from %s within %s (--timeout)", rc.Host, q.timeout)}
		}
		return &clusterVersions{Error: err.Error()}
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return unreachable(err)
	}
	raw, err := client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return unreachable(err)
	}
	var kv kversion.Info
	if err := json.Unmarshal(raw, &kv); err != nil {
		return unreachable(fmt.Errorf("%s/version: %w", rc.Host, err))
	}
	c := &clusterVersions{Reachable: true, Kubernetes: kv.GitVersion}
	c.Webhook = webhookVersions(ctx, client, q.webhookNamespace, q.webhookSelector)
	c.Sidecars = &podVersions{Namespace: q.namespace, Selector: sidecarSelector, Versions: []versionCount{}}
	if meta, err := metadata.NewForConfig(rc); err != nil {
		c.Sidecars.Error = err.Error()
	} else {
		c.Sidecars = sidecarVersions(ctx, meta, q.namespace)
	}
	return c
}

// webhookVersions counts the webhook's pods in namespace ("" for all) that
// selector selects, by version: the label app.kubernetes.io/version, else
// the webhook container's image tag.
func webhookVersions(ctx context.Context, client kubernetes.Interface, namespace, selector string) *podVersions {
	p := &podVersions{Namespace: namespace, Selector: selector, Versions: []versionCount{}}
	counts := map[string]int{}
	opts := metav1.ListOptions{LabelSelector: selector, FieldSelector: notFinished, Limit: listPage}
	for {
		pods, err := client.CoreV1().Pods(namespace).List(ctx, opts)
		if err != nil {
			p.Error = listError(ctx, err)
			return p
		}
		for i := range pods.Items {
			counts[webhookPodVersion(&pods.Items[i])]++
		}
		if opts.Continue = pods.Continue; opts.Continue == "" {
			break
		}
	}
	p.Versions = sortedCounts(counts)
	return p
}

// webhookPodVersion is a webhook pod's version: its label
// app.kubernetes.io/version, else the tag of its webhook container's image
// (its first container's, if none is named webhook), else unknownVersion.
func webhookPodVersion(pod *corev1.Pod) string {
	if v := pod.Labels[webhookVersionLabel]; v != "" {
		return v
	}
	if len(pod.Spec.Containers) == 0 {
		return unknownVersion
	}
	c := pod.Spec.Containers[0]
	if i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == webhookContainer }); i >= 0 {
		c = pod.Spec.Containers[i]
	}
	if tag := imageTag(c.Image); tag != "" {
		return tag
	}
	return unknownVersion
}

// imageTag is the tag of an image reference (registry/repo:tag@digest), ""
// when it has none.
func imageTag(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") { // a registry's port
		return ""
	}
	return ref[i+1:]
}

// sidecarVersions counts the injected pods in namespace ("" for all) that
// have not finished, by their annotation handoff.dev/version; it lists
// their metadata alone.
func sidecarVersions(ctx context.Context, client metadata.Interface, namespace string) *podVersions {
	p := &podVersions{Namespace: namespace, Selector: sidecarSelector, Versions: []versionCount{}}
	counts := map[string]int{}
	pods := client.Resource(corev1.SchemeGroupVersion.WithResource("pods"))
	opts := metav1.ListOptions{LabelSelector: sidecarSelector, FieldSelector: notFinished, Limit: listPage}
	for {
		list, err := pods.Namespace(namespace).List(ctx, opts)
		if err != nil {
			p.Error = listError(ctx, err)
			return p
		}
		for _, pod := range list.Items {
			v := pod.Annotations[inject.AnnotationVersion]
			if v == "" {
				v = unknownVersion
			}
			counts[v]++
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}
	p.Versions = sortedCounts(counts)
	return p
}

// listError says why a list failed, the deadline if it passed.
func listError(ctx context.Context, err error) string {
	if ctx.Err() != nil {
		return "no answer within --timeout: " + err.Error()
	}
	return err.Error()
}

// sortedCounts lists counts newest version first: semantic versions in
// their order, then other strings in theirs, then unknownVersion.
func sortedCounts(counts map[string]int) []versionCount {
	out := make([]versionCount, 0, len(counts))
	for v, n := range counts {
		out = append(out, versionCount{Version: v, Pods: n})
	}
	rank := func(v string) int {
		switch {
		case v == unknownVersion:
			return 2
		case semver.IsValid(v):
			return 0
		}
		return 1
	}
	slices.SortFunc(out, func(a, b versionCount) int {
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
