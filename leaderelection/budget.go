package leaderelection

import (
	"fmt"
	"time"
)

// What one Lease's election sends through the rate limiter of its client
// (client-go's token bucket, rest.Config QPS and Burst), from client-go's
// tools/leaderelection v0.37 on a LeaseLock and this package's standby. A
// watch is not rate-limited by client-go (rest.Request.Watch).
const (
	// startRequests: room for twice what the start of a free Lease
	// sends, with a retry of each: the list of the standby's watch (none
	// when client-go's informer streams its list through the watch) and
	// the acquiring create or update. The holder's elector then sends
	// nothing until its first renewal a retry period later: its first read
	// is answered from the acquiring write and its first two writes are
	// skipped (Elector.lead). A release is one write.
	startRequests = 4
	// renewRequests per retry period while held, with room for one
	// failure in each: client-go renews with one write (its fast path)
	// and, after a failed one, a read and a write.
	renewRequests = 2
)

// Bounds of the Lease client's budget. The floor is what a sidecar with a
// few Leases had before the budget was sized: room for a release's
// conflicts and retries. The ceiling keeps one pod's Lease traffic to what
// a share of an apiserver core serves (docs/performance.md measures the
// apiserver's CPU per Lease).
const (
	MinClientQPS   = 20
	MinClientBurst = 40
	MaxClientQPS   = 500
)

// Budget is the rate budget of the Lease client that a sidecar's electors
// share.
type Budget struct {
	// QPS is the token bucket's refill, requests per second; Burst its size.
	QPS   float32
	Burst int
	// Leases is how many Leases this budget keeps renewed within the renew
	// deadline: renewRequests each per retry period. A sidecar with more
	// sends its renewals late, queued in the token bucket, and loses
	// Leases.
	Leases int
	// Want is the number of Leases the budget was asked for.
	Want int
	// RetryPeriod is the retry period it was sized for.
	RetryPeriod time.Duration
}

// ClientBudget sizes the budget of the client shared by the electors of n
// Leases with the given retry period (positive). QPS is renewRequests per
// Lease per retry period, at least MinClientQPS, at most MaxClientQPS.
// Burst is startRequests per Lease it can hold, at least MinClientBurst: the
// electors' start (and a release of every Lease at once, two requests each)
// goes out at once, without waiting on the bucket. A Lease read or write
// waits in the bucket at most RequestTimeout, so a renewal queued behind
// more than the budget fails, and with it, within the renew deadline, the
// Lease.
func ClientBudget(n int, retryPeriod time.Duration) Budget {
	perLease := renewRequests / retryPeriod.Seconds() // requests per second
	qps := min(MaxClientQPS, max(MinClientQPS, float64(n)*perLease))
	holdable := int(qps/perLease + 1e-9) // not 2.9999 for 3
	return Budget{
		QPS:         float32(qps),
		Burst:       max(MinClientBurst, startRequests*min(n, holdable)),
		Leases:      holdable,
		Want:        n,
		RetryPeriod: retryPeriod,
	}
}

// Enough reports whether the budget holds every Lease it was asked for.
func (b Budget) Enough() bool { return b.Want <= b.Leases }

// Shortfall says, when the budget is not Enough, what it cannot hold, in
// words beginning "the Lease client's budget"; "" otherwise.
func (b Budget) Shortfall() string {
	if b.Enough() {
		return ""
	}
	return fmt.Sprintf("the Lease client's budget of %.0f requests/s (at most %d) keeps at most %d Leases renewed within the renew deadline at retry period %s (%d requests per Lease each retry period); %d Leases are configured: renewals will be late and Leases lost. Raise retry-period or spread the Leases over more pods",
		b.QPS, MaxClientQPS, b.Leases, b.RetryPeriod, renewRequests, b.Want)
}
