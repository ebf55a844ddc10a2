package sidecar

import (
	"net/http"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// ScrapeWatch notes when the metrics are scraped, so that a sidecar about
// to exit can wait for one scrape that reads its last counts.
//
// A pod's counters end with the pod, and the sidecar counts its sequence's
// outcome moments before it exits: a scraper that comes every 30 s would
// rarely see handoff_shutdowns_total{outcome="Abandoned"} move, and an
// alert on it would never fire. After its sequence, the sidecar waits
// (Linger) until a scrape has begun since the sequence ended, bounded.
type ScrapeWatch struct {
	clock clock.Clock

	mu         sync.Mutex
	last, prev time.Time     // the starts of the latest two scrapes; zero: none yet
	next       chan struct{} // closed at the next scrape's start
}

// NewScrapeWatch returns a ScrapeWatch that reads the time from clk.
func NewScrapeWatch(clk clock.Clock) *ScrapeWatch {
	return &ScrapeWatch{clock: clk, next: make(chan struct{})}
}

// Handler returns h noting the start of each request as a scrape.
func (w *ScrapeWatch) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.scraped()
		h.ServeHTTP(rw, r)
	})
}

func (w *ScrapeWatch) scraped() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prev, w.last = w.last, w.clock.Now()
	close(w.next)
	w.next = make(chan struct{})
}

// LingerResult says how a Linger ended.
type LingerResult string

// How a Linger ends.
const (
	LingerNeverScraped LingerResult = "never-scraped" // no scrape since the start: nothing waits for one
	LingerScraped      LingerResult = "scraped"       // a scrape began after Linger was called
	LingerTimedOut     LingerResult = "timed-out"     // the bound came first
	LingerCanceled     LingerResult = "canceled"      // stop was closed first
)

// Linger waits until a scrape begins after the call, so that the counts
// made before it are read once, and returns how the wait ended and how long
// it took. The wait is bounded by the first of:
//
//   - limit from now (at most; 0 or less: no wait);
//   - 1.5 times the interval between the latest two scrapes, from the latest
//     (a scraper's next visit is due one interval after its last; the half is
//     for its jitter and a slow scrape), when there have been two;
//   - stop closing (a second signal, or the end of the grace period).
//
// A sidecar never scraped does not wait: nothing scrapes it.
func (w *ScrapeWatch) Linger(limit time.Duration, stop <-chan struct{}) (LingerResult, time.Duration) {
	w.mu.Lock()
	last, prev, next := w.last, w.prev, w.next
	w.mu.Unlock()
	start := w.clock.Now()
	if last.IsZero() {
		return LingerNeverScraped, 0
	}
	wait := limit
	if !prev.IsZero() {
		due := last.Add(last.Sub(prev) * 3 / 2)
		wait = min(wait, due.Sub(start))
	}
	if wait <= 0 {
		return LingerTimedOut, 0
	}
	t := w.clock.NewTimer(wait)
	defer t.Stop()
	select {
	case <-next:
		return LingerScraped, w.clock.Since(start)
	case <-t.C():
		return LingerTimedOut, w.clock.Since(start)
	case <-stop:
		return LingerCanceled, w.clock.Since(start)
	}
}
