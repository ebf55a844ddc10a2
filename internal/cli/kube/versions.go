package kube

import (
	"context"
	"errors"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/handoff-dev/handoff/inject"
)

// Where the webhook's pods are, and what says their version.
const (
	// WebhookSelector selects the chart's webhook pods (its labels:
	// part-of and component, which nameOverride and the release name leave
	// as they are).
	WebhookSelector = "app.kubernetes.io/part-of=handoff,app.kubernetes.io/component=webhook"
	// WebhookVersionLabel is the label of a webhook pod that gives its
	// version (the chart sets it from its appVersion); without it, the
	// webhook container's image tag does.
	WebhookVersionLabel = "app.kubernetes.io/version"
	// WebhookContainer is the chart's name of the webhook's container.
	WebhookContainer = "webhook"
)

// WebhookVersions counts the webhook's pods in namespace ("" for all) that
// selector selects and that have not finished, by version
// (WebhookPodVersion). Its error says why a list failed, "no answer within
// --timeout: ..." when ctx ended.
func WebhookVersions(ctx context.Context, client kubernetes.Interface, namespace, selector string) (map[string]int, error) {
	counts := map[string]int{}
	opts := metav1.ListOptions{LabelSelector: selector, FieldSelector: NotFinished, Limit: ListPage}
	for {
		pods, err := client.CoreV1().Pods(namespace).List(ctx, opts)
		if err != nil {
			return nil, listError(ctx, err)
		}
		for i := range pods.Items {
			counts[WebhookPodVersion(&pods.Items[i])]++
		}
		if opts.Continue = pods.Continue; opts.Continue == "" {
			return counts, nil
		}
	}
}

// SidecarVersions counts the injected pods in namespace ("" for all) that
// have not finished, by their annotation handoff.dev/version
// (UnknownVersion without it); it lists their metadata alone. Its error is
// as WebhookVersions'.
func SidecarVersions(ctx context.Context, client metadata.Interface, namespace string) (map[string]int, error) {
	counts := map[string]int{}
	pods := client.Resource(corev1.SchemeGroupVersion.WithResource("pods"))
	opts := metav1.ListOptions{LabelSelector: SidecarSelector, FieldSelector: NotFinished, Limit: ListPage}
	for {
		list, err := pods.Namespace(namespace).List(ctx, opts)
		if err != nil {
			return nil, listError(ctx, err)
		}
		for _, pod := range list.Items {
			v := pod.Annotations[inject.AnnotationVersion]
			if v == "" {
				v = UnknownVersion
			}
			counts[v]++
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return counts, nil
		}
	}
}

// listError says why a list failed, the deadline if it passed.
func listError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errors.New("no answer within --timeout: " + err.Error())
	}
	return err
}

// WebhookPodVersion is a webhook pod's version: its label
// app.kubernetes.io/version, else the tag of its webhook container's image
// (its first container's, if none is named webhook), else UnknownVersion.
func WebhookPodVersion(pod *corev1.Pod) string {
	if v := pod.Labels[WebhookVersionLabel]; v != "" {
		return v
	}
	if len(pod.Spec.Containers) == 0 {
		return UnknownVersion
	}
	c := pod.Spec.Containers[0]
	if i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == WebhookContainer }); i >= 0 {
		c = pod.Spec.Containers[i]
	}
	if tag := ImageTag(c.Image); tag != "" {
		return tag
	}
	return UnknownVersion
}

// ImageTag is the tag of an image reference (registry/repo:tag@digest), ""
// when it has none.
func ImageTag(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") { // a registry's port
		return ""
	}
	return ref[i+1:]
}
