package leaderelection

// Hop names a point on the path of a handover, from the holder's release
// write to the standby's term, for Config.Trace.
type Hop int

// The hops, in the order a handover passes them.
const (
	// HopReleaseSent is when the holder's release write (empty holder
	// identity) is about to be sent.
	HopReleaseSent Hop = iota
	// HopReleaseAcked is when the apiserver acknowledged that write.
	HopReleaseAcked
	// HopFreeSeen is when the standby's watch of the Lease delivered it
	// free (no holder, or deleted), in the informer's event handler.
	HopFreeSeen
	// HopFreeAnswered is when the standby's client-go elector was handed
	// the Lease free, or missing (its Get returned it from the watch).
	HopFreeAnswered
	// HopAcquireSent is when the standby's acquiring write is about to be
	// sent.
	HopAcquireSent
	// HopAcquireAcked is when the apiserver acknowledged that write; the
	// term (OnTerm) follows at once.
	HopAcquireAcked
)

// String is the hop's short name, for logs and test failures.
func (h Hop) String() string {
	switch h {
	case HopReleaseSent:
		return "release-sent"
	case HopReleaseAcked:
		return "release-acked"
	case HopFreeSeen:
		return "free-seen"
	case HopFreeAnswered:
		return "free-answered"
	case HopAcquireSent:
		return "acquire-sent"
	case HopAcquireAcked:
		return "acquire-acked"
	}
	return "unknown"
}

// trace calls Config.Trace, if set, with h.
func (e *Elector) trace(h Hop) {
	if e.cfg.Trace != nil {
		e.cfg.Trace(h)
	}
}
