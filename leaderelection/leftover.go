package leaderelection

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"
)

// ReleaseLeftover frees the Lease namespace/name if it still names
// identity, with no election running for it: the record client-go's own
// release writes (no holder, lease duration 1 s, renew and acquire time
// now), so that the next holder, this identity included, acquires it with
// a new transition and so a greater fencing token. It is for a Lease a
// previous term left held (its release withheld) once the process that
// led under that term is known to be gone. It reports whether it wrote the
// release; a Lease held by another identity, or missing, is left alone.
// Each request is bounded by timeout; a conflict is read again, up to 3
// times; it returns the API's error otherwise.
func ReleaseLeftover(ctx context.Context, leases coordinationv1client.LeasesGetter, namespace, name, identity string, timeout time.Duration) (bool, error) {
	freed, _, err := ReleaseLeftoverRead(ctx, leases, namespace, name, identity, timeout)
	return freed, err
}

// ReleaseLeftoverRead is ReleaseLeftover, and also reports whether it read
// the Lease free (it exists and names no holder), and so wrote nothing: a
// release of this identity written before, whose answer was lost, leaves
// it so.
func ReleaseLeftoverRead(ctx context.Context, leases coordinationv1client.LeasesGetter, namespace, name, identity string, timeout time.Duration) (freed, free bool, err error) {
	client := boundedLeases{LeasesGetter: leases, timeout: timeout}.Leases(namespace)
	for range 3 {
		l, err := client.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, false, nil
		}
		if err != nil {
			return false, false, fmt.Errorf("lease %s/%s: %w", namespace, name, err)
		}
		if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != identity {
			return false, h == "", nil
		}
		now := metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity = ptr.To("")
		l.Spec.LeaseDurationSeconds = ptr.To[int32](1)
		l.Spec.RenewTime, l.Spec.AcquireTime = &now, &now
		_, err = client.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			return true, false, nil
		}
		if !apierrors.IsConflict(err) {
			return false, false, fmt.Errorf("lease %s/%s: %w", namespace, name, err)
		}
	}
	return false, false, fmt.Errorf("lease %s/%s: not released: written by another client at each of 3 attempts", namespace, name)
}
