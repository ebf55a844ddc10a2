// Package leadtrace records the leadership a sidecar tells an app, as the
// app sees it, and counts its lapses: for the scale test and benchmark. It
// wraps the worker library's app handler and reads each leadership message
// (PUT protocol.LeasePathPrefix+name) before the handler applies it.
package leadtrace

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// Trace counts, per Lease, the terms the app was granted and the lapses
// between them. A lapse is a stretch in which the app, once granted a term
// of a Lease, does not lead it: its term's Until passed before the next
// renewal arrived, or the sidecar revoked it (outside a shutdown sequence
// the trace is told of with Leaving), until a new grant or the end of the
// trace. The Until of a grant is the worker library's: the message's
// Until, capped at its arrival plus ValidForMillis.
type Trace struct {
	now func() time.Time

	mu      sync.Mutex
	leases  map[string]*lease
	leaving bool
}

type lease struct {
	seq     int64
	granted time.Time // first grant; zero until then
	until   time.Time // end of the current term; revoked: the revoke's arrival
	leading bool      // granted and not revoked
	// handedOver: revoked after Leaving, the handover's end of the term.
	handedOver bool
	token      int64     // fencing token of the current term
	termStart  time.Time // arrival of the current term's first grant
	lapses     int
	lapsed     time.Duration
	grants     int
	revokes    int
}

// New returns an empty Trace on the real clock.
func New() *Trace { return &Trace{now: time.Now, leases: map[string]*lease{}} }

// Wrap returns h with the leadership messages it serves recorded in t.
func (t *Trace) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, protocol.LeasePathPrefix) {
			received := t.now()
			body, err := io.ReadAll(r.Body)
			if err == nil {
				var l protocol.Leadership
				if json.Unmarshal(body, &l) == nil {
					t.record(strings.TrimPrefix(r.URL.Path, protocol.LeasePathPrefix), l, received)
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
		}
		h.ServeHTTP(w, r)
	})
}

// Leaving marks the start of a shutdown sequence: revokes from here on are
// the handover, not lapses.
func (t *Trace) Leaving() {
	t.mu.Lock()
	t.leaving = true
	t.mu.Unlock()
}

func (t *Trace) record(name string, m protocol.Leadership, received time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.leases[name]
	if l == nil {
		l = &lease{}
		t.leases[name] = l
	}
	if m.Sequence <= l.seq { // the app ignores it as stale
		return
	}
	l.seq = m.Sequence
	if !m.Leader {
		if l.leading {
			// Outside a shutdown sequence a lapse begins; it is counted at
			// the next grant or at the end.
			l.revokes++
			l.until = minTime(l.until, received)
			l.leading, l.handedOver = false, t.leaving
		}
		return
	}
	until := received.Add(time.Duration(m.ValidForMillis) * time.Millisecond)
	if !m.Until.IsZero() && m.Until.Before(until) {
		until = m.Until
	}
	if !l.granted.IsZero() && received.After(l.until) {
		l.lapses++
		l.lapsed += received.Sub(l.until)
	}
	if l.granted.IsZero() {
		l.granted = received
	}
	if !l.leading || m.FencingToken != l.token || received.After(l.until) {
		l.token, l.termStart = m.FencingToken, received
	}
	l.grants++
	l.until, l.leading, l.handedOver = until, true, false
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Summary is what the trace saw up to now.
type Summary struct {
	// Leases granted at least once, and the number of grant messages
	// (acquisitions and renewals) and revokes applied.
	Leases, Grants, Revokes int
	// Lapses counts the stretches without leadership after a first grant,
	// one still going on now included; Lapsed is their total length up to
	// now.
	Lapses int
	Lapsed time.Duration
	// Leading is the number of Leases whose term is current now.
	Leading int
}

// Summary counts the trace up to now.
func (t *Trace) Summary() Summary {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	var s Summary
	for _, l := range t.leases {
		if l.granted.IsZero() {
			continue
		}
		s.Leases++
		s.Grants += l.grants
		s.Revokes += l.revokes
		s.Lapses += l.lapses
		s.Lapsed += l.lapsed
		switch {
		case now.Before(l.until):
			s.Leading++
		case !l.handedOver:
			// Lapsed now (a term handed over after Leaving is not a lapse).
			s.Lapses++
			s.Lapsed += now.Sub(l.until)
		}
	}
	return s
}

// Leading reports whether the app leads name now.
func (t *Trace) Leading(name string) bool {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.leases[name]
	return l != nil && !l.granted.IsZero() && now.Before(l.until)
}

// TermStart is when the app was first told of its current (or last) term
// of name, and its fencing token; zero if never.
func (t *Trace) TermStart(name string) (time.Time, int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.leases[name]; l != nil {
		return l.termStart, l.token
	}
	return time.Time{}, 0
}
