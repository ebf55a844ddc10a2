package leaderelection

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
// Each request is bounded by timeout; a Lease whose holder changed between
// the read and the write is read again, up to 3 times; it returns the API's
// error otherwise. Needs get and patch on the Lease.
func ReleaseLeftover(ctx context.Context, leases coordinationv1client.LeasesGetter, namespace, name, identity string, timeout time.Duration) (bool, error) {
	freed, _, err := ReleaseLeftoverRead(ctx, leases, namespace, name, identity, timeout)
	return freed, err
}

// ReleaseLeftoverRead is ReleaseLeftover, and also reports whether it read
// the Lease free (it exists and names no holder), and so wrote nothing: a
// release of this identity written before, whose answer was lost, leaves
// it so.
//
// The release is a JSON patch that tests the holder identity and writes
// the release record, not an update of the object as read: a patch does not
// meet a conflict when another client (a controller adding a label or an
// annotation) writes the Lease between the read and the write, which an
// update would, at every attempt while that client writes. The test keeps
// what the update's resource version kept: a Lease another identity took
// meanwhile is not freed (the patch fails and the Lease is read again, up
// to 3 times).
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
		patch, err := releasePatch(identity, metav1.NewMicroTime(time.Now()))
		if err != nil {
			return false, false, err
		}
		_, err = client.Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			return true, false, nil
		case apierrors.IsInvalid(err) || apierrors.IsConflict(err):
			// The holder moved since the read (the test failed): read again.
		case apierrors.IsNotFound(err):
			return false, false, nil
		default:
			return false, false, fmt.Errorf("lease %s/%s: %w", namespace, name, err)
		}
	}
	return false, false, fmt.Errorf("lease %s/%s: not released: its holder changed between the read and the release at each of 3 attempts", namespace, name)
}

// releasePatch is the JSON patch that releases a Lease held by identity:
// a test of spec.holderIdentity, then client-go's release record (no
// holder, lease duration 1 s, renew and acquire time now; the transition
// count, the fencing token, unchanged).
func releasePatch(identity string, now metav1.MicroTime) ([]byte, error) {
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	return json.Marshal([]op{
		{"test", "/spec/holderIdentity", identity},
		{"add", "/spec/holderIdentity", ""},
		{"add", "/spec/leaseDurationSeconds", 1},
		{"add", "/spec/renewTime", now},
		{"add", "/spec/acquireTime", now},
	})
}
