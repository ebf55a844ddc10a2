// Package stats holds the small figures the benchmark commands print.
package stats

import (
	"fmt"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p ≤ 100) of d by nearest
// rank; 0 for no samples.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// Summary is "p50 … p99 … max … (n samples)".
func Summary(d []time.Duration) string {
	return fmt.Sprintf("p50 %-9s p99 %-9s max %-9s (n=%d)", Round(Percentile(d, 50)), Round(Percentile(d, 99)), Round(Percentile(d, 100)), len(d))
}

// Round keeps three significant figures or so for printing.
func Round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	default:
		return d.Round(10 * time.Microsecond)
	}
}
