package config_test

import (
	"errors"
	"net"
	"net/url"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/protocol"
)

// FuzzLoad gives two settings of config.Table (picked by index) fuzzed
// values, through each kind of source. It checks that
//   - flags, environment variables, an explicit map and (for annotation
//     settings) annotations give the same Settings, or errors that differ
//     only in the origin they name;
//   - every error is a *config.Error naming a setting of the table, its
//     accepted form and, for a value's own error, the origin and the value;
//   - accepted Settings hold the relations client-go needs, a loopback
//     control address, an app URL the protocol paths can be appended to,
//     and load back to the same Settings from their own rendering.
//
// Run: go test ./config -run '^$' -fuzz FuzzLoad (or hack/fuzz.sh).
func FuzzLoad(f *testing.F) {
	index := func(name string) uint8 {
		for i, d := range config.Table {
			if d.Name == name {
				return uint8(i)
			}
		}
		panic(name)
	}
	for _, seed := range []struct{ a, va, b, vb string }{
		{"lease-duration", "15s", "renew-deadline", "10s"},
		{"lease-duration", "15", "retry-period", "x"},
		{"lease-duration", "3s", "renew-deadline", "3s"},
		{"renew-deadline", "2.4s", "retry-period", "2s"},
		{"deadline-margin", "-1s", "handback-reserve", "0"},
		{"grace-period", "999999h", "fallback", "cancel"},
		{"fallback", "Return", "fallback", "abandon"},
		{"leases", "a, b,,c", "pod-name", "w-0"},
		{"leases", "a,a", "pod-uid", "u"},
		{"leases", "Work_Queue", "pod-uid", ""},
		{"control-addr", "[::1]:7450", "metrics-addr", ":0"},
		{"control-addr", "localhost:+7450", "metrics-addr", "0.0.0.0:65536"},
		{"control-addr", "127.0.0.1", "metrics-addr", "[::]:7451"},
		{"app-url", "http://127.0.0.1:7452/", "kubeconfig", "/etc/kubeconfig"},
		{"app-url", "http://localhost:7452//", "pod-namespace", "ns"},
		{"app-url", "http://127.0.0.1:7452?x=1", "pod-name", "p"},
		{"app-url", "http://[::1]:7452#frag", "pod-name", "p"},
		{"app-url", "https://127.0.0.1:7452", "pod-name", "p"},
		{"app-url", "http://127.0.0.1:http", "pod-name", "p"},
		{"app-url", "http://127.0.0.1:7452/app", "pod-name", "p"},
		{"app-url", "unix:///handoff-run/app.sock", "control-addr", "unix://relative.sock"},
		{"app-url", "unix:///a/../b.sock", "control-addr", "unix:///" + strings.Repeat("x", 200)},
		// Durations whose sum, or whose conversion, wraps.
		{"deadline-margin", "2000000h", "handback-reserve", "2000000h"},
		{"deadline-margin", "1h", "handback-reserve", "1h0m0.000000001s"},
		{"grace-period", "9223372036854775807s", "deadline-margin", "2s"},
		{"grace-period", "2562047h47m16s", "deadline-margin", "1h"},
		{"grace-period", "2562047h47m16.854775807s", "handback-reserve", "0"},
		{"grace-period", "2562047h47m16.854775808s", "handback-reserve", "-2562047h47m16.854775808s"},
		{"renew-deadline", "2000000h", "retry-period", "1000000h"},
		{"lease-duration", "9223372036854775807ns", "retry-period", "-9223372036854775808ns"},
	} {
		f.Add(index(seed.a), seed.va, index(seed.b), seed.vb)
	}
	f.Fuzz(func(t *testing.T, i uint8, vi string, j uint8, vj string) {
		a, b := config.Table[int(i)%len(config.Table)], config.Table[int(j)%len(config.Table)]
		values := map[string]string{a.Name: vi}
		if _, ok := values[b.Name]; !ok {
			values[b.Name] = vj
		}

		fromMap, mapErr := config.Load(config.Map(values, "test"))
		checkErr(t, values, mapErr, "test")

		env := map[string]string{}
		for name, v := range values {
			d, _ := config.Lookup(name)
			env[d.Env()] = v
		}
		fromEnv, envErr := config.Load(config.Environ(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
		sameResult(t, "environment", fromMap, mapErr, fromEnv, envErr)

		fs := pflag.NewFlagSet("fuzz", pflag.ContinueOnError)
		flags := config.Flags(fs)
		var args []string
		for name, v := range values {
			args = append(args, "--"+name+"="+v)
		}
		if err := fs.Parse(args); err != nil {
			t.Fatalf("flags %q: %v", args, err)
		}
		fromFlags, flagErr := config.Load(flags)
		sameResult(t, "flags", fromMap, mapErr, fromFlags, flagErr)

		if a.Annotation && (b.Annotation || a.Name == b.Name) {
			annotations := map[string]string{}
			for name, v := range values {
				d, _ := config.Lookup(name)
				annotations[d.AnnotationKey()] = v
			}
			fromAnn, annErr := config.Load(config.Annotations(annotations))
			sameResult(t, "annotations", fromMap, mapErr, fromAnn, annErr)
		}

		if mapErr != nil {
			return
		}
		checkSettings(t, values, fromMap)
		again, err := config.Load(config.Map(render(fromMap), "rendering"))
		if err != nil {
			t.Fatalf("%q loaded, but its rendering %q does not: %v", values, render(fromMap), err)
		}
		if !reflect.DeepEqual(again, fromMap) {
			t.Errorf("%q loaded as %+v, its rendering %q as %+v", values, fromMap, render(fromMap), again)
		}
	})
}

// checkErr checks that err, from Load over values with origin, is made of
// *config.Error values each naming its setting and accepted form, and, for
// an error of one value, the origin and the value.
func checkErr(t *testing.T, values map[string]string, err error, origin string) {
	t.Helper()
	if err == nil {
		return
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("%q: error %v is not a joined list", values, err)
	}
	for _, e := range joined.Unwrap() {
		var ce *config.Error
		if !errors.As(e, &ce) {
			t.Fatalf("%q: error %v is not a *config.Error", values, e)
		}
		d, ok := config.Lookup(ce.Setting)
		if !ok {
			t.Fatalf("%q: error %v names no setting of the table", values, e)
		}
		msg := e.Error()
		form := d.Form
		if strings.HasPrefix(ce.Reason, "required") {
			form = d.RequiredForm() // empty is what is refused
		}
		if !strings.HasPrefix(msg, d.Name+": ") || !strings.HasSuffix(msg, "; want "+form) || ce.Reason == "" {
			t.Errorf("%q: error %q does not start with the setting %s, give a reason and end with its form %q", values, msg, d.Name, form)
		}
		if ce.Origin == "" {
			continue // a relation between settings
		}
		if v, given := values[d.Name]; !given || ce.Origin != origin || ce.Value != v {
			t.Errorf("%q: error %q is about a value not given, or names the wrong origin", values, msg)
		}
	}
}

// sameResult checks that two sources with the same values load alike:
// both the same Settings, or both errors that read the same once the
// origins are set aside.
func sameResult(t *testing.T, source string, want *config.Settings, wantErr error, got *config.Settings, gotErr error) {
	t.Helper()
	if (wantErr == nil) != (gotErr == nil) {
		t.Fatalf("from a map: %v; from %s: %v", wantErr, source, gotErr)
	}
	if wantErr != nil {
		if a, b := settingsNamed(wantErr), settingsNamed(gotErr); !reflect.DeepEqual(a, b) {
			t.Errorf("from a map, errors for %v (%v); from %s, for %v (%v)", a, wantErr, source, b, gotErr)
		}
		return
	}
	if !reflect.DeepEqual(want, got) {
		t.Errorf("from a map: %+v; from %s: %+v", want, source, got)
	}
}

func settingsNamed(err error) []string {
	var names []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ce *config.Error
		if errors.As(e, &ce) {
			names = append(names, ce.Setting+" "+ce.Reason)
		}
	}
	return names
}

// checkSettings checks what every accepted Settings value must hold.
func checkSettings(t *testing.T, values map[string]string, s *config.Settings) {
	t.Helper()
	if s.RenewDeadline >= s.LeaseDuration || float64(s.RenewDeadline) <= 1.2*float64(s.RetryPeriod) {
		t.Errorf("%q: accepted timings %s/%s/%s that client-go refuses", values, s.LeaseDuration, s.RenewDeadline, s.RetryPeriod)
	}
	if s.DeadlineMargin < 0 || s.HandbackReserve < 0 || s.GracePeriod < 0 {
		t.Errorf("%q: accepted a negative duration: %+v", values, s)
	}
	// Every duration within its bound, so that the sums and differences the
	// sidecar makes of them cannot wrap.
	for name, d := range map[string]time.Duration{"lease-duration": s.LeaseDuration, "renew-deadline": s.RenewDeadline,
		"retry-period": s.RetryPeriod, "deadline-margin": s.DeadlineMargin, "handback-reserve": s.HandbackReserve} {
		if d > config.MaxDuration {
			t.Errorf("%q: accepted %s %s, above %s", values, name, d, config.MaxDuration)
		}
	}
	if s.GracePeriod > config.MaxGracePeriod {
		t.Errorf("%q: accepted grace-period %s, above %s", values, s.GracePeriod, config.MaxGracePeriod)
	}
	if sum := s.DeadlineMargin + s.HandbackReserve; sum < s.DeadlineMargin || sum < s.HandbackReserve {
		t.Errorf("%q: deadline-margin %s plus handback-reserve %s wraps to %s", values, s.DeadlineMargin, s.HandbackReserve, sum)
	}
	if left := s.GracePeriod - s.DeadlineMargin; left > s.GracePeriod {
		t.Errorf("%q: grace-period %s minus deadline-margin %s wraps to %s", values, s.GracePeriod, s.DeadlineMargin, left)
	}
	// Each address is a socket by an absolute, clean path short enough to
	// bind, or TCP on loopback: the protocol never leaves the pod.
	for name, e := range map[string]protocol.Endpoint{"control-addr": s.ControlAddr, "app-url": s.AppURL} {
		switch e.Network {
		case "unix":
			if !filepath.IsAbs(e.Address) || filepath.Clean(e.Address) != e.Address || len(e.Address) > 107 {
				t.Errorf("%q: accepted %s socket %q", values, name, e.Address)
			}
		case "tcp":
			host, _, err := net.SplitHostPort(e.Address)
			if ip := net.ParseIP(host); err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
				t.Errorf("%q: accepted %s %q, not a loopback host:port", values, name, e.Address)
			}
		default:
			t.Errorf("%q: accepted %s %+v, neither a socket nor TCP", values, name, e)
		}
	}
	// The clients call URL() + a protocol path: the result must be that
	// path, not a query or fragment holding it.
	for _, p := range []string{protocol.StopClaimingPath, protocol.DrainPath, protocol.ReturnPath, protocol.LeasePathPrefix + "work"} {
		u, err := url.Parse(s.AppURL.URL() + p)
		if err != nil || u.Scheme != "http" || u.Path != p || u.RawQuery != "" || u.Fragment != "" {
			t.Errorf("%q: app URL %q + %q is %v (%v), not the path %s on the app", values, s.AppURL.URL(), p, u, err, p)
		}
	}
	for _, l := range s.Leases {
		if l == "" || strings.ContainsAny(l, ", ") {
			t.Errorf("%q: Lease name %q", values, l)
		}
	}
}

// render writes s back as setting values.
// render is s as the value of every setting in config.Table
// (TestRenderNamesEverySetting keeps it so).
func render(s *config.Settings) map[string]string {
	return map[string]string{
		"pod-name": s.PodName, "pod-namespace": s.PodNamespace, "pod-uid": s.PodUID, "worker-container": s.WorkerContainer,
		"leases": strings.Join(s.Leases, ","), "role-leases": strings.Join(s.RoleLeases, ","),
		"shards": strings.Join(s.Shards, ","), "shard-peers": s.ShardPeers,
		"lease-duration": s.LeaseDuration.String(), "renew-deadline": s.RenewDeadline.String(), "retry-period": s.RetryPeriod.String(),
		"grace-period": s.GracePeriod.String(), "deadline-margin": s.DeadlineMargin.String(), "handback-reserve": s.HandbackReserve.String(),
		"fallback":     string(s.Fallback),
		"control-addr": s.ControlAddr.String(), "metrics-addr": s.MetricsAddr, "app-url": s.AppURL.String(),
		"kubeconfig": s.Kubeconfig, "token-file": s.TokenFile, "log-level": string(s.LogLevel), "metrics-linger": s.MetricsLinger.String(),
		"deletion-cost": strconv.FormatBool(s.DeletionCost), "prefer-successor": strconv.FormatBool(s.PreferSuccessor),
	}
}

// render must name every setting, or a new one escapes the round trip.
func TestRenderNamesEverySetting(t *testing.T) {
	r := render(&config.Settings{})
	for _, d := range config.Table {
		if _, ok := r[d.Name]; !ok {
			t.Errorf("render does not name setting %s", d.Name)
		}
	}
	if len(r) != len(config.Table) {
		t.Errorf("render names %d settings, config.Table has %d", len(r), len(config.Table))
	}
}
