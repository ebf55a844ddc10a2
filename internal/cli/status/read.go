package status

import (
	"context"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/handoff-dev/handoff/internal/cli/kube"
)

// statusLimits bound what one view reads, so that a large namespace costs a
// bounded time and memory: at most this many injected pods, Events and
// Leases are read (a view that reached one says so in its error).
const (
	statusMaxPods   = 2000
	statusMaxEvents = 5000
	statusMaxLeases = 2000
	// statusMaxNamespaceLeases bounds the Leases of the namespace read to
	// find the pods' (in pages of kube.ListPage).
	statusMaxNamespaceLeases = 20000
)

// statusQuery is where status looks, and how long one view may take.
type statusQuery struct {
	client              kubernetes.Interface
	namespace, selector string
	timeout             time.Duration
}

// read makes one view within q.timeout, from lists of the injected pods,
// the namespace's Events about pods, and the Leases the pods name.
func (q statusQuery) read(ctx context.Context) (Report, error) {
	r, _, err := q.readAt(ctx)
	return r, err
}

// readAt is read, with the resource versions of its pod and Event lists
// (for watch).
func (q statusQuery) readAt(ctx context.Context) (Report, [2]string, error) {
	ctx, cancel := context.WithTimeout(ctx, q.timeout)
	defer cancel()
	var rvs [2]string
	pods, err := q.client.CoreV1().Pods(q.namespace).List(ctx, metav1.ListOptions{LabelSelector: q.selector, Limit: statusMaxPods})
	if err != nil {
		return Report{}, rvs, fmt.Errorf("listing the injected pods (%s) in namespace %s: %w", q.selector, q.namespace, err)
	}
	if pods.Continue != "" {
		return Report{}, rvs, fmt.Errorf("namespace %s has more than %d injected pods matching %s: narrow it with --selector", q.namespace, statusMaxPods, q.selector)
	}
	events, err := q.client.CoreV1().Events(q.namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.kind", "Pod").String(), Limit: statusMaxEvents})
	if err != nil {
		return Report{}, rvs, fmt.Errorf("listing the Events about pods in namespace %s: %w", q.namespace, err)
	}
	rvs = [2]string{pods.ResourceVersion, events.ResourceVersion}
	names := map[string]bool{}
	for i := range pods.Items {
		c := podConfig(&pods.Items[i])
		for _, l := range append(slices.Clone(c.leases), c.shardLeases...) {
			names[l] = true
		}
	}
	if len(names) > statusMaxLeases {
		return Report{}, rvs, fmt.Errorf("the injected pods in namespace %s name %d Leases, more than %d: narrow it with --selector", q.namespace, len(names), statusMaxLeases)
	}
	leases := map[string]*coordinationv1.Lease{}
	opts := metav1.ListOptions{Limit: kube.ListPage}
	for read := 0; len(names) > 0; {
		list, err := q.client.CoordinationV1().Leases(q.namespace).List(ctx, opts)
		if err != nil {
			return Report{}, rvs, fmt.Errorf("listing the Leases in namespace %s: %w", q.namespace, err)
		}
		for i := range list.Items {
			if l := &list.Items[i]; names[l.Name] {
				leases[l.Name] = l
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
		if read += len(list.Items); read >= statusMaxNamespaceLeases {
			return Report{}, rvs, fmt.Errorf("namespace %s has more than %d Leases: status reads them all to find its pods'", q.namespace, statusMaxNamespaceLeases)
		}
	}
	r := buildStatus(time.Now(), q.namespace, q.selector, pods.Items, events.Items, leases)
	if events.Continue != "" {
		r.Warnings = append(r.Warnings, fmt.Sprintf("namespace %s has more than %d Events about pods: only the first %d were read, so a last handover may lack steps", q.namespace, statusMaxEvents, statusMaxEvents))
	}
	return r, rvs, nil
}

// watch calls show with a view, then again each time a pod, an Event or a
// Lease of the namespace changes (at most twice a second), until ctx ends
// (nil) or a view cannot be read (its error).
func (q statusQuery) watch(ctx context.Context, show func(Report) error) error {
	for {
		r, rvs, err := q.readAt(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := show(r); err != nil {
			return err
		}
		changed, stop, err := q.watchChanges(ctx, rvs)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-changed:
		}
		stop()
		// At most twice a second: a rollout changes many objects at once.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// watchChanges watches the injected pods and the Events about pods from
// the resource versions rvs, and the Leases of the namespace; changed is
// closed at the first change (or when a watch ends: the view is read
// again). stop ends the watches.
func (q statusQuery) watchChanges(ctx context.Context, rvs [2]string) (changed <-chan struct{}, stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	pw, err := q.client.CoreV1().Pods(q.namespace).Watch(ctx, metav1.ListOptions{LabelSelector: q.selector, ResourceVersion: rvs[0]})
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("watching the injected pods in namespace %s: %w", q.namespace, err)
	}
	ew, err := q.client.CoreV1().Events(q.namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.kind", "Pod").String(), ResourceVersion: rvs[1]})
	if err != nil {
		pw.Stop()
		cancel()
		return nil, nil, fmt.Errorf("watching the Events in namespace %s: %w", q.namespace, err)
	}
	// Leases from now: a renewal changes the term left, which the view
	// shows, so every Lease update is a change.
	lw, err := q.client.CoordinationV1().Leases(q.namespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		pw.Stop()
		ew.Stop()
		cancel()
		return nil, nil, fmt.Errorf("watching the Leases in namespace %s: %w", q.namespace, err)
	}
	ch := make(chan struct{})
	first := make(chan struct{}, 3)
	for _, w := range []watch.Interface{pw, ew, lw} {
		go func() {
			select {
			case <-w.ResultChan():
			case <-ctx.Done():
			}
			first <- struct{}{}
		}()
	}
	go func() {
		select {
		case <-first:
			close(ch)
		case <-ctx.Done():
		}
	}()
	return ch, func() {
		cancel()
		pw.Stop()
		ew.Stop()
		lw.Stop()
	}, nil
}
