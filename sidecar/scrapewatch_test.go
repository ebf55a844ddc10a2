package sidecar_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/handoff-dev/handoff/sidecar"
)

// scrape sends one request through w's handler, as a scraper would, from
// the address from.
func scrape(w *sidecar.ScrapeWatch, from string) {
	h := w.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	r.RemoteAddr = from + ":40000"
	h.ServeHTTP(httptest.NewRecorder(), r)
}

// The addresses of two scrapers.
const (
	promA = "10.0.0.1"
	promB = "10.0.0.2"
)

type lingered struct {
	result sidecar.LingerResult
	waited time.Duration
}

// linger runs w.Linger in a goroutine and waits until it waits on clk.
func linger(t *testing.T, clk *clocktesting.FakeClock, w *sidecar.ScrapeWatch, limit time.Duration, stop chan struct{}) <-chan lingered {
	t.Helper()
	out := make(chan lingered, 1)
	since := clk.Now()
	go func() {
		r, d := w.Linger(since, limit, stop)
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

	// Never scraped, or once (a person's curl): no scraper, no wait.
	if r, d := w.Linger(clk.Now(), time.Minute, nil); r != sidecar.LingerNoScraper || d != 0 {
		t.Fatalf("never scraped: Linger = %s after %s, want %s at once", r, d, sidecar.LingerNoScraper)
	}
	scrape(w, "10.9.9.9")
	if r, d := w.Linger(clk.Now(), time.Minute, nil); r != sidecar.LingerNoScraper || d != 0 {
		t.Fatalf("one request: Linger = %s after %s, want %s at once", r, d, sidecar.LingerNoScraper)
	}

	// Scraped every 10 s; the sequence ends 2 s after the last scrape. The
	// next scrape, 8 s later, ends the wait.
	scrape(w, promA)
	clk.Step(10 * time.Second)
	scrape(w, promA)
	clk.Step(2 * time.Second)
	out := linger(t, clk, w, time.Minute, nil)
	clk.Step(8 * time.Second)
	scrape(w, promA)
	if l := <-out; l.result != sidecar.LingerScraped || l.waited != 8*time.Second {
		t.Errorf("scraped 8s into the wait: Linger = %s after %s, want %s after 8s", l.result, l.waited, sidecar.LingerScraped)
	}

	// A scrape after the sequence ended, before the call: read already.
	since := clk.Now()
	clk.Step(time.Second)
	scrape(w, promA)
	if r, d := w.Linger(since, time.Minute, nil); r != sidecar.LingerRead || d != 0 {
		t.Errorf("scraped after the sequence: Linger = %s after %s, want %s at once", r, d, sidecar.LingerRead)
	}
}

// An HA pair of Prometheus servers, each every 30 s, 3 s apart: the wait
// is for either one's next visit, not over 1.5 times the 3 s between them.
func TestLingerWaitsForAnHAPair(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	w := sidecar.NewScrapeWatch(clk)
	scrape(w, promA) // +0
	clk.Step(3 * time.Second)
	scrape(w, promB) // +3
	clk.Step(27 * time.Second)
	scrape(w, promA) // +30
	clk.Step(3 * time.Second)
	scrape(w, promB) // +33
	clk.Step(2 * time.Second)
	out := linger(t, clk, w, time.Minute, nil) // +35
	clk.Step(20 * time.Second)
	select {
	case l := <-out:
		t.Fatalf("Linger = %s after %s, before either scraper's next visit (A at +60)", l.result, l.waited)
	default:
	}
	clk.Step(5 * time.Second)
	scrape(w, promA) // +60
	if l := <-out; l.result != sidecar.LingerScraped || l.waited != 25*time.Second {
		t.Errorf("Linger = %s after %s, want %s after 25s (A's visit at +60)", l.result, l.waited, sidecar.LingerScraped)
	}
}

func TestLingerIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit time.Duration
		want  time.Duration
	}{
		// 1.5 intervals from the last scrape (at +0; Linger at +2s): 15s - 2s.
		{"a scraper that stopped coming", time.Minute, 13 * time.Second},
		{"the limit first", 5 * time.Second, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			w := sidecar.NewScrapeWatch(clk)
			scrape(w, promA)
			clk.Step(10 * time.Second)
			scrape(w, promA)
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
		scrape(w, promA)
		clk.Step(10 * time.Second)
		scrape(w, promA)
		clk.Step(time.Second)
		if r, d := w.Linger(clk.Now(), 0, nil); r != sidecar.LingerTimedOut || d != 0 {
			t.Errorf("limit 0: Linger = %s after %s, want %s at once", r, d, sidecar.LingerTimedOut)
		}
		clk.Step(time.Minute)
		if r, d := w.Linger(clk.Now(), time.Minute, nil); r != sidecar.LingerTimedOut || d != 0 {
			t.Errorf("a minute after a 10s scraper's last visit: Linger = %s after %s, want %s at once", r, d, sidecar.LingerTimedOut)
		}
	})

	t.Run("stop", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		w := sidecar.NewScrapeWatch(clk)
		scrape(w, promA)
		clk.Step(10 * time.Second)
		scrape(w, promA)
		stop := make(chan struct{})
		out := linger(t, clk, w, time.Minute, stop)
		clk.Step(time.Second)
		close(stop)
		if l := <-out; l.result != sidecar.LingerCanceled || l.waited != time.Second {
			t.Errorf("stopped after 1s: Linger = %s after %s, want %s after 1s", l.result, l.waited, sidecar.LingerCanceled)
		}
	})
}
