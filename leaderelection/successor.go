package leaderelection

import (
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"
)

// AnnotationSuccessor is the Lease annotation a release writes beside the
// empty holder identity: the holder identity of the candidate the leaving
// holder prefers as its successor (Config.Successor). Every other write of
// the Lease (a renewal, an acquisition) removes it.
//
// It is a preference, not a hand-over: the release still frees the Lease
// (the pod-bound Lease policy lets a sidecar name only itself or no one as
// holder), the named candidate takes it as any standby would, with its own
// write, and the other standbys hold back for SuccessorGrace from when
// their watch showed the release, then compete as before. The fencing
// token grows on the successor's acquisition as on any other.
const AnnotationSuccessor = "handoff.dev/successor"

// SuccessorGrace is how long a standby that is not the named successor
// waits, from when its watch shows a release naming another candidate,
// before it competes for the Lease. The named candidate, a standby whose
// watch is up, acquires one watch event and one Lease write after the
// release: a few milliseconds, tens on a loaded apiserver
// (docs/performance.md, the hops of bench/takeover). Half a second covers
// that with room for a GC pause or a slow write; it is the longest a Lease
// stays free when the named candidate is gone or cannot write, after which
// the others compete as they would have without the preference.
const SuccessorGrace = 500 * time.Millisecond

// successorOf returns the successor a free Lease's release named, "" when
// it names none or the Lease is held.
func successorOf(lease *coordinationv1.Lease) string {
	if lease == nil || ptr.Deref(lease.Spec.HolderIdentity, "") != "" {
		return ""
	}
	return lease.Annotations[AnnotationSuccessor]
}

// withSuccessor returns the Lease to write: with AnnotationSuccessor set to
// successor on a release (an empty holder identity) that names one other
// than identity, without it on every other write. lease is not modified;
// the copy is made only when the annotation changes.
func withSuccessor(lease *coordinationv1.Lease, identity string, successor func() string) *coordinationv1.Lease {
	name := ""
	if ptr.Deref(lease.Spec.HolderIdentity, "") == "" && successor != nil {
		if name = successor(); name == identity {
			name = ""
		}
	}
	have, ok := lease.Annotations[AnnotationSuccessor]
	if name == "" && !ok || name != "" && ok && have == name {
		return lease
	}
	out := lease.DeepCopy()
	if name == "" {
		delete(out.Annotations, AnnotationSuccessor)
		return out
	}
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[AnnotationSuccessor] = name
	return out
}
