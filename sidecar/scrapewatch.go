package sidecar

import (
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// maxScrapers bounds the scrapers a ScrapeWatch keeps, by address: an HA
// pair of Prometheus servers and a few more. The one seen longest ago makes
// room for a new one.
const maxScrapers = 8

// ScrapeWatch notes when the metrics are scraped, and by whom, so that a
// sidecar about to exit can wait for one scrape that reads its last counts.
//
// A pod's counters end with the pod, and the sidecar counts its sequence's
// outcome moments before it exits: a scraper that comes every 30 s would
// rarely see handoff_shutdowns_total{outcome="Abandoned"} move, and an
// alert on it would never fire. After its sequence, the sidecar waits
// (Linger) until a scrape has begun since the sequence ended, bounded.
//
// A scraper is an address (the request's remote IP) seen scraping twice or
// more: its interval is the time between its last two scrapes. A request
// seen once (a person's curl) is no scraper.
type ScrapeWatch struct {
	clock clock.Clock

	mu       sync.Mutex
	scrapers map[string]*scraper // by remote IP
	last     time.Time           // the start of the latest scrape, by anyone
	next     chan struct{}       // closed at the next scrape's start
}

// scraper is one address's latest two scrapes.
type scraper struct {
	last, prev time.Time // prev zero: seen once
}

// NewScrapeWatch returns a ScrapeWatch that reads the time from clk.
func NewScrapeWatch(clk clock.Clock) *ScrapeWatch {
	return &ScrapeWatch{clock: clk, scrapers: map[string]*scraper{}, next: make(chan struct{})}
}

// Handler returns h noting the start of each request as a scrape by the
// request's remote IP.
func (w *ScrapeWatch) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		w.scraped(host)
		h.ServeHTTP(rw, r)
	})
}

func (w *ScrapeWatch) scraped(from string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.clock.Now()
	s := w.scrapers[from]
	if s == nil {
		if len(w.scrapers) >= maxScrapers {
			var oldest string
			for addr, o := range w.scrapers {
				if oldest == "" || o.last.Before(w.scrapers[oldest].last) {
					oldest = addr
				}
			}
			delete(w.scrapers, oldest)
		}
		s = &scraper{}
		w.scrapers[from] = s
	}
	s.prev, s.last = s.last, now
	w.last = now
	close(w.next)
	w.next = make(chan struct{})
}

// LingerResult says how a Linger ended.
type LingerResult string

// How a Linger ends.
const (
	LingerNoScraper LingerResult = "no-scraper" // nothing scrapes this sidecar (no address seen twice): no wait
	LingerRead      LingerResult = "read"       // a scrape began after since already: no wait
	LingerScraped   LingerResult = "scraped"    // a scrape began during the wait
	LingerTimedOut  LingerResult = "timed-out"  // the bound came first
	LingerCanceled  LingerResult = "canceled"   // stop was closed first
)

// Linger waits until a scrape begins that reads the counts made up to
// since (the end of the sequence), and returns how the wait ended and how
// long it took. A scrape that began after since ends it at once. The wait
// is bounded by the first of:
//
//   - limit from now (0 or less: no wait);
//   - the latest of the scrapers' next visits, each due 1.5 of its
//     interval after its last (the half for its jitter and a slow scrape):
//     a scraper that stopped coming is not waited for;
//   - stop closing (a second signal).
//
// A sidecar no address has scraped twice does not wait.
func (w *ScrapeWatch) Linger(since time.Time, limit time.Duration, stop <-chan struct{}) (LingerResult, time.Duration) {
	w.mu.Lock()
	last, next := w.last, w.next
	var due time.Time
	for _, s := range w.scrapers {
		if s.prev.IsZero() {
			continue
		}
		if d := s.last.Add(s.last.Sub(s.prev) * 3 / 2); d.After(due) {
			due = d
		}
	}
	w.mu.Unlock()
	start := w.clock.Now()
	switch {
	case due.IsZero():
		return LingerNoScraper, 0
	case last.After(since):
		return LingerRead, 0
	}
	wait := min(limit, due.Sub(start))
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
