package prestop_test

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

// FuzzCall has prestop.Call ask a sidecar that answers a fuzzed status and
// body. It checks that anything but 200 is an error naming the status, that
// a 200 gives a Report only from a body json.Unmarshal reads as one (and
// then the same Report), and a "decoding report" error otherwise.
//
// Run: go test ./prestop -run '^$' -fuzz FuzzCall (or hack/fuzz.sh).
func FuzzCall(f *testing.F) {
	report := `{"trigger":"preStop","started":"2026-01-02T03:04:05Z","deadline":"2026-01-02T03:04:30Z","deadlineSource":"deletionTimestamp","outcome":"Returned","inFlightAtDeadline":2,"returned":2,"leases":[{"lease":"work","wasLeader":true,"released":true}],"steps":[{"name":"stop-claiming","at":"2026-01-02T03:04:05Z"}],"finished":"2026-01-02T03:04:07Z"}`
	for _, s := range []struct {
		status uint16
		body   string
	}{
		{0, report},
		{0, `{"outcome":"Drained","errors":["release work: conflict"]}`},
		{0, `{"started":"yesterday"}`},
		{0, `{"leases":{}}`},
		{0, `null`},
		{0, ``},
		{0, report + "\n" + report},
		{303, "shutdown: context canceled\n"},
		{205, report},
		{4, report},
	} {
		f.Add(s.status, []byte(s.body))
	}
	var (
		mu     sync.Mutex
		status int
		body   []byte
		sent   []byte
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		// Call makes a client per call: close each connection, or they pile up.
		w.Header().Set("Connection", "close")
		w.WriteHeader(status)
		sent = body
		if _, err := w.Write(body); err != nil {
			sent = nil
		}
	}))
	f.Cleanup(srv.Close)
	addr := protocol.Endpoint{Network: "tcp", Address: srv.Listener.Addr().String()}
	f.Fuzz(func(t *testing.T, code uint16, b []byte) {
		mu.Lock()
		status, body = 200+int(code)%400, b
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rep, err := prestop.Call(ctx, addr, testToken, time.Second)
		mu.Lock()
		code2, got := status, sent
		mu.Unlock()
		if (rep == nil) == (err == nil) {
			t.Fatalf("report %v and error %v: want exactly one", rep, err)
		}
		if code2 != http.StatusOK {
			if err == nil || !strings.Contains(err.Error(), strconv.Itoa(code2)) {
				t.Fatalf("status %d: error %v, want one naming the status", code2, err)
			}
			return
		}
		var want protocol.Report
		if jerr := json.Unmarshal(got, &want); jerr != nil {
			if err == nil || !strings.Contains(err.Error(), "decoding report") {
				t.Fatalf("body %q (%v): error %v, want a decoding error", got, jerr, err)
			}
			return
		}
		if err != nil || !reflect.DeepEqual(*rep, want) {
			t.Fatalf("body %q: report %+v, %v; json.Unmarshal reads %+v", got, rep, err, want)
		}
	})
}

// FuzzTerminationOf gives prestop.TerminationOf a pod with fuzzed grace
// periods (the pod's, and the worker's liveness and startup probes', any
// int64 as the API takes them), container state and deletion, and fuzzed
// settings. It checks that no grace period wraps:
//   - a kill without a deletionTimestamp gets a deadline from now minus
//     the margin (a grace period of 0 or less) to now plus
//     config.MaxGracePeriod, never millions of hours in the past;
//   - a longer grace period (pod or probe) never gives an earlier deadline;
//   - a deletion's deadline is the deletionTimestamp minus the margin, an
//     unread pod's now plus the grace period minus the margin, each taken
//     into its bounds.
//
// Run: go test ./prestop -run '^$' -fuzz FuzzTerminationOf (or hack/fuzz.sh).
func FuzzTerminationOf(f *testing.F) {
	const (
		liveness = 1 << iota
		startup
		started
		notStarted
		deleting
		unread
	)
	for _, s := range []struct {
		podGrace, live, start int64
		flags                 uint8
		grace, margin         time.Duration
	}{
		{30, 10, 5, liveness | startup | started, 20 * time.Second, 2 * time.Second},
		// A probe's terminationGracePeriodSeconds of 10000000000, and
		// others beyond a time.Duration: never a deadline in the past.
		{30, 10000000000, 0, liveness | started, 30 * time.Second, 2 * time.Second},
		{30, 0, 10000000000, startup | notStarted, 30 * time.Second, 2 * time.Second},
		{30, 18446744080, math.MaxInt64, liveness | startup, 30 * time.Second, 2 * time.Second},
		{math.MaxInt64, 0, 0, started, 30 * time.Second, 2 * time.Second},
		{math.MinInt64, 0, 0, started, 30 * time.Second, 2 * time.Second},
		{config.MaxGracePeriodSeconds, config.MaxGracePeriodSeconds, 1, liveness | startup, config.MaxGracePeriod, config.MaxDuration},
		{30, 0, 0, deleting, 30 * time.Second, 2000000 * time.Hour},
		{30, 0, 0, unread, math.MaxInt64, math.MinInt64},
		{30, 0, 0, unread, 2000000 * time.Hour, 2000000 * time.Hour},
	} {
		f.Add(s.podGrace, s.live, s.start, s.flags, int64(s.grace), int64(s.margin))
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, podGrace, live, start int64, flags uint8, grace, margin int64) {
		pod := func(podGrace, live, start int64) *corev1.Pod {
			if flags&unread != 0 {
				return nil
			}
			w := corev1.Container{Name: "worker"}
			if flags&liveness != 0 {
				w.LivenessProbe = &corev1.Probe{TerminationGracePeriodSeconds: ptr.To(live)}
			}
			if flags&startup != 0 {
				w.StartupProbe = &corev1.Probe{TerminationGracePeriodSeconds: ptr.To(start)}
			}
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
				Spec:       corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To(podGrace), Containers: []corev1.Container{w}},
			}
			if flags&(started|notStarted) != 0 {
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", Started: ptr.To(flags&started != 0)}}
			}
			if flags&deleting != 0 {
				p.DeletionTimestamp = &metav1.Time{Time: now.Add(7 * time.Second)}
			}
			return p
		}
		term := func(podGrace, live, start int64) prestop.Termination {
			return prestop.TerminationOf(pod(podGrace, live, start), "worker", now, time.Duration(grace), time.Duration(margin))
		}
		got := term(podGrace, live, start)
		m := min(max(time.Duration(margin), 0), config.MaxDuration)
		g := min(max(time.Duration(grace), 0), config.MaxGracePeriod)
		switch {
		case flags&unread != 0:
			if !got.Deadline.Equal(now.Add(g - m)) {
				t.Fatalf("pod unread, grace period %d ns, margin %d ns: deadline %s; want now + %s - %s", grace, margin, got.Deadline, g, m)
			}
			return
		case flags&deleting != 0:
			if want := now.Add(7*time.Second - m); !got.Deadline.Equal(want) || got.Source != prestop.SourceDeletionTimestamp {
				t.Fatalf("deleting, margin %d ns: deadline %s from %s; want %s from the deletionTimestamp", margin, got.Deadline, got.Source, want)
			}
			return
		}
		if got.Deadline.Before(now.Add(-m)) || got.Deadline.After(now.Add(config.MaxGracePeriod)) {
			t.Fatalf("pod grace %d s, liveness %d s, startup %d s (flags %b), margin %s: deadline now%+.0fh from %s; want from now-%s to now+%s",
				podGrace, live, start, flags, m, got.Deadline.Sub(now).Hours(), got.Source, m, config.MaxGracePeriod)
		}
		// One second more, wherever it goes, gives no earlier deadline.
		if podGrace == math.MaxInt64 || live == math.MaxInt64 || start == math.MaxInt64 {
			return
		}
		for _, more := range []prestop.Termination{term(podGrace+1, live, start), term(podGrace, live+1, start), term(podGrace, live, start+1)} {
			if more.Deadline.Before(got.Deadline) {
				t.Fatalf("pod grace %d s, liveness %d s, startup %d s (flags %b): one second more gives deadline %s, before %s",
					podGrace, live, start, flags, more.Deadline, got.Deadline)
			}
		}
	})
}
