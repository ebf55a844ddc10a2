package sidecar_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/handoff-dev/handoff/sidecar"
)

// scrape sends one request through w's handler, as a scraper would.
func scrape(w *sidecar.ScrapeWatch) {
	h := w.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/metrics", nil))
}

type lingered struct {
	result sidecar.LingerResult
	waited time.Duration
}

// linger runs w.Linger in a goroutine and waits until it waits on clk.
func linger(t *testing.T, clk *clocktesting.FakeClock, w *sidecar.ScrapeWatch, limit time.Duration, stop chan struct{}) <-chan lingered {
	t.Helper()
	out := make(chan lingered, 1)
	go func() {
		r, d := w.Linger(limit, stop)
		out <- lingered{r, d}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !clk.HasWaiters() {
		select {
		case l := <-out:
			out <- l // it did not wait at all
			return out
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("Linger neither returned nor waited on the clock within 5s")
		}
		time.Sleep(time.Millisecond)
	}
	return out
}

func TestLingerWaitsForTheNextScrapeOnlyIfScraped(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	w := sidecar.NewScrapeWatch(clk)

	// Never scraped: nothing scrapes this sidecar, so it does not wait.
	if r, d := w.Linger(time.Minute, nil); r != sidecar.LingerNeverScraped || d != 0 {
		t.Fatalf("never scraped: Linger = %s after %s, want %s at once", r, d, sidecar.LingerNeverScraped)
	}

	// Scraped every 10 s; the sequence ends 2 s after the last scrape. The
	// next scrape, 8 s later, ends the wait.
	scrape(w)
	clk.Step(10 * time.Second)
	scrape(w)
	clk.Step(2 * time.Second)
	out := linger(t, clk, w, time.Minute, nil)
	clk.Step(8 * time.Second)
	scrape(w)
	if l := <-out; l.result != sidecar.LingerScraped || l.waited != 8*time.Second {
		t.Errorf("scraped 8s into the wait: Linger = %s after %s, want %s after 8s", l.result, l.waited, sidecar.LingerScraped)
	}
}

func TestLingerIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration // between the two scrapes before; 0: one scrape only
		limit    time.Duration
		want     time.Duration
	}{
		// 1.5 intervals from the last scrape (at +0; Linger at +2s): 15s - 2s.
		{"a scraper that stopped coming", 10 * time.Second, time.Minute, 13 * time.Second},
		{"the limit first", 10 * time.Second, 5 * time.Second, 5 * time.Second},
		{"one scrape: no interval known, the limit", 0, 30 * time.Second, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			w := sidecar.NewScrapeWatch(clk)
			scrape(w)
			if tc.interval > 0 {
				clk.Step(tc.interval)
				scrape(w)
			}
			clk.Step(2 * time.Second)
			out := linger(t, clk, w, tc.limit, nil)
			clk.Step(tc.want - time.Millisecond)
			select {
			case l := <-out:
				t.Fatalf("Linger = %s after %s, before its bound %s", l.result, l.waited, tc.want)
			default:
			}
			clk.Step(time.Millisecond)
			if l := <-out; l.result != sidecar.LingerTimedOut || l.waited != tc.want {
				t.Errorf("Linger = %s after %s, want %s after %s", l.result, l.waited, sidecar.LingerTimedOut, tc.want)
			}
		})
	}

	t.Run("a scraper overdue already, or no time left", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		w := sidecar.NewScrapeWatch(clk)
		scrape(w)
		clk.Step(10 * time.Second)
		scrape(w)
		if r, d := w.Linger(0, nil); r != sidecar.LingerTimedOut || d != 0 {
			t.Errorf("limit 0: Linger = %s after %s, want %s at once", r, d, sidecar.LingerTimedOut)
		}
		clk.Step(time.Minute)
		if r, d := w.Linger(time.Minute, nil); r != sidecar.LingerTimedOut || d != 0 {
			t.Errorf("a minute after a 10s scraper's last visit: Linger = %s after %s, want %s at once", r, d, sidecar.LingerTimedOut)
		}
	})

	t.Run("stop", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		w := sidecar.NewScrapeWatch(clk)
		scrape(w)
		stop := make(chan struct{})
		out := linger(t, clk, w, time.Minute, stop)
		clk.Step(time.Second)
		close(stop)
		if l := <-out; l.result != sidecar.LingerCanceled || l.waited != time.Second {
			t.Errorf("stopped after 1s: Linger = %s after %s, want %s after 1s", l.result, l.waited, sidecar.LingerCanceled)
		}
	})
}
