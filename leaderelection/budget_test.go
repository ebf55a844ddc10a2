package leaderelection

import (
	"strings"
	"testing"
	"time"
)

// The budget is two requests per Lease per retry period, between the floor
// and the ceiling; its burst covers the start of every Lease it can hold;
// past the ceiling it says how many it holds.
func TestClientBudget(t *testing.T) {
	for _, tc := range []struct {
		n           int
		retryPeriod time.Duration
		qps         float32
		burst       int
		leases      int
	}{
		{0, 2 * time.Second, MinClientQPS, MinClientBurst, 20},
		{1, 2 * time.Second, MinClientQPS, MinClientBurst, 20},
		{20, 2 * time.Second, MinClientQPS, 80, 20},
		{100, 2 * time.Second, 100, 400, 100}, // the scale case: 50 renewals/s, twice that
		{3, 300 * time.Millisecond, MinClientQPS, MinClientBurst, 3},
		{500, 2 * time.Second, MaxClientQPS, 2000, 500},
		{1000, 2 * time.Second, MaxClientQPS, 2000, 500}, // the ceiling
		{1000, 5 * time.Second, 400, 4000, 1000},
		{3, 10 * time.Millisecond, MaxClientQPS, MinClientBurst, 2},
	} {
		b := ClientBudget(tc.n, tc.retryPeriod)
		if b.QPS != tc.qps || b.Burst != tc.burst || b.Leases != tc.leases {
			t.Errorf("ClientBudget(%d, %s) = QPS %v, burst %d, Leases %d; want %v, %d, %d",
				tc.n, tc.retryPeriod, b.QPS, b.Burst, b.Leases, tc.qps, tc.burst, tc.leases)
		}
		if got, want := b.Enough(), tc.n <= tc.leases; got != want {
			t.Errorf("ClientBudget(%d, %s).Enough() = %v, want %v", tc.n, tc.retryPeriod, got, want)
		}
		if short := b.Shortfall(); (short == "") != b.Enough() || (short != "" && !strings.Contains(short, "keeps at most")) {
			t.Errorf("ClientBudget(%d, %s).Shortfall() = %q", tc.n, tc.retryPeriod, short)
		}
	}
}
