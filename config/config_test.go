package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/protocol"
)

func TestDefaultsAreValid(t *testing.T) {
	s, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	if s.LeaseDuration != 15*time.Second || s.RenewDeadline != 10*time.Second || s.RetryPeriod != 2*time.Second {
		t.Errorf("timings = %s/%s/%s, want client-go's 15s/10s/2s", s.LeaseDuration, s.RenewDeadline, s.RetryPeriod)
	}
	if s.Fallback != config.FallbackReturn || len(s.Leases) != 0 || s.ControlAddr.String() != "unix:///handoff-run/control.sock" || s.AppURL.String() != "unix:///handoff-run/app.sock" {
		t.Errorf("fallback %s, leases %v, control %s", s.Fallback, s.Leases, s.ControlAddr)
	}
}

func TestBadValuesNameSettingOriginAndForm(t *testing.T) {
	for _, tc := range []struct {
		values map[string]string
		want   []string
	}{
		{map[string]string{"lease-duration": "15"}, []string{"lease-duration", `"15"`, "not a duration", "like 15s"}},
		{map[string]string{"lease-duration": "1s"}, []string{"lease-duration", "below the minimum 2s"}},
		{map[string]string{"renew-deadline": "20s"}, []string{"renew-deadline", "not shorter than lease-duration 15s"}},
		{map[string]string{"retry-period": "9s"}, []string{"retry-period", "1.2", "renew-deadline 10s"}},
		{map[string]string{"fallback": "drop"}, []string{"fallback", `"drop"`, "one of return, cancel, abandon"}},
		{map[string]string{"control-addr": "0.0.0.0:7450"}, []string{"control-addr", "not a loopback address"}},
		{map[string]string{"app-url": "http://10.0.0.1:80"}, []string{"app-url", "not a loopback address"}},
		{map[string]string{"app-url": "unix://app.sock"}, []string{"app-url", "not absolute", "unix:///handoff-run/app.sock"}},
		{map[string]string{"leases": "Work_Queue"}, []string{"leases", "not a DNS subdomain"}},
		{map[string]string{"leases": "a,a"}, []string{"leases", "listed twice"}},
		{map[string]string{"leases": "a", "pod-name": "p", "pod-uid": "u", "role-leases": "b"}, []string{"role-leases", `"b" is not one of leases "a"`, "names from leases"}},
		{map[string]string{"role-leases": "a,a"}, []string{"role-leases", "listed twice"}},
		{map[string]string{"control-addr": "127.0.0.1:"}, []string{"control-addr", `port "" is not a number from 0 to 65535`}},
		{map[string]string{"metrics-addr": ":99999"}, []string{"metrics-addr", `port "99999"`}},
		{map[string]string{"app-url": "http://127.0.0.1:http"}, []string{"app-url"}},
		{map[string]string{"app-url": "http://127.0.0.1:7452?x=1"}, []string{"app-url", "no user, path, query or fragment"}},
		{map[string]string{"app-url": "http://127.0.0.1:7452#"}, []string{"app-url", "no user, path, query or fragment"}},
		{map[string]string{"app-url": "http://127.0.0.1:7452/a//b"}, []string{"app-url", "no user, path, query or fragment"}},
		{map[string]string{"leases": "a"}, []string{"pod-name: required when leases are set", "pod-uid: required when leases are set"}},
		{map[string]string{"leases": "a", "pod-name": "p"}, []string{"pod-uid: required when leases are set", "want a UID"}},
		{map[string]string{"shards": "a", "shard-peers": "app=x", "pod-uid": "u"}, []string{"pod-name: required when shards are set", "want a pod name"}},
		{map[string]string{"shards": "orders-{00..11}"}, []string{"shards", "{00..11}", "without leading zeros"}},
		{map[string]string{"shards": "orders-{0..011}"}, []string{"shards", "{0..011}", "without leading zeros"}},
		{map[string]string{"shards": "orders-{0..+3}"}, []string{"shards", "not {0..K}"}},
		{map[string]string{"shards": "orders-{0..3},extra"}, []string{"shards", "cannot be mixed with a list"}},
		{map[string]string{"shards": "orders-{1..3}"}, []string{"shards", "{1..3}", "not {0..K}", "PREFIX{0..K}"}},
		{map[string]string{"shards": "orders-{0..x}"}, []string{"shards", "not {0..K}"}},
		{map[string]string{"shards": "orders-{0..3}-x"}, []string{"shards", "at the end of the name"}},
		{map[string]string{"shards": "Orders-{0..3}"}, []string{"shards", `"Orders-0" is not a DNS subdomain`}},
		{map[string]string{"shards": "o-{0..1000}"}, []string{"shards", "1001 shards: at most 1000"}},
		{map[string]string{"shards": "a,b", "pod-name": "p", "pod-uid": "u"}, []string{"shard-peers", "required when shards are set: it selects the pods that share them; want a label selector, like app=orders"}},
		{map[string]string{"shards": "a,b", "leases": "b", "shard-peers": "app=x", "pod-name": "p", "pod-uid": "u"}, []string{"shards", `"b" is also one of leases`}},
		{map[string]string{"shards": "a", "shard-peers": "app=x"}, []string{"pod-name", "required when shards are set"}},
		{map[string]string{"shard-peers": "app==x==y"}, []string{"shard-peers", "not a label selector", "like app=orders"}},
		{map[string]string{"worker-container": "Worker_1"}, []string{"worker-container", `"Worker_1"`, "not a container name", "DNS label"}},
	} {
		_, err := config.Load(config.Map(tc.values, "annotation"))
		if err == nil {
			t.Errorf("%v: accepted", tc.values)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not say %q", tc.values, err, w)
			}
		}
		if strings.Contains(err.Error(), "required") && strings.Contains(err.Error(), "or empty") {
			t.Errorf("%v: error %q offers empty for a setting it requires", tc.values, err)
		}
	}
}

func TestEveryBadValueIsReportedAtOnce(t *testing.T) {
	_, err := config.Load(config.Map(map[string]string{"fallback": "x", "retry-period": "y"}, "test"))
	if err == nil || !strings.Contains(err.Error(), "fallback") || !strings.Contains(err.Error(), "retry-period") {
		t.Fatalf("error %v: want both settings named", err)
	}
}

func TestFlagsWinOverEnvironment(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	flags := config.Flags(fs)
	if err := fs.Parse([]string{"--fallback=cancel"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"HANDOFF_FALLBACK": "abandon", "HANDOFF_LEASE_DURATION": "bad"}
	_, err := config.Load(flags, config.Environ(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
	if err == nil || !strings.Contains(err.Error(), "environment variable HANDOFF_LEASE_DURATION") {
		t.Fatalf("error %v: want the environment variable named", err)
	}
	delete(env, "HANDOFF_LEASE_DURATION")
	s, err := config.Load(flags, config.Environ(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
	if err != nil {
		t.Fatal(err)
	}
	if s.Fallback != config.FallbackCancel {
		t.Errorf("fallback = %s, want the flag's cancel", s.Fallback)
	}
}

func TestRoleLeasesAreRolesTheRestPartitions(t *testing.T) {
	s, err := config.Load(config.Map(map[string]string{"leases": "cron,shard-0", "role-leases": "cron", "pod-name": "p", "pod-uid": "u"}, "test"))
	if err != nil {
		t.Fatal(err)
	}
	if !s.IsRole("cron") || s.IsRole("shard-0") {
		t.Errorf("IsRole(cron) = %t, IsRole(shard-0) = %t; want true, false", s.IsRole("cron"), s.IsRole("shard-0"))
	}
	d, _ := config.Load()
	if d == nil || len(d.RoleLeases) != 0 {
		t.Errorf("default role-leases = %v, want none: every Lease a partition", d)
	}
}

func TestShardSetByRangeOrList(t *testing.T) {
	for v, want := range map[string]string{
		"orders-{0..3}": "orders-0,orders-1,orders-2,orders-3",
		"orders-{0..0}": "orders-0",
		"eu, us":        "eu,us",
		"":              "",
	} {
		s, err := config.Load(config.Map(map[string]string{"shards": v, "shard-peers": "app=orders", "pod-name": "p", "pod-uid": "u"}, "annotation"))
		if err != nil {
			t.Fatalf("shards %q: %v", v, err)
		}
		if got := strings.Join(s.Shards, ","); got != want {
			t.Errorf("shards %q = %q, want %q", v, got, want)
		}
		if s.ShardPeers != "app=orders" {
			t.Errorf("shard-peers = %q", s.ShardPeers)
		}
	}
}

func TestIdentityIsPodNameAndUID(t *testing.T) {
	s, err := config.Load(config.Map(map[string]string{"pod-name": "w-0", "pod-uid": "1234", "leases": "a, b"}, "test"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Identity() != "w-0_1234" || strings.Join(s.Leases, ",") != "a,b" {
		t.Errorf("identity %q, leases %v", s.Identity(), s.Leases)
	}
}

func TestAnnotationKeys(t *testing.T) {
	d, _ := config.Lookup("fallback")
	if d.AnnotationKey() != "handoff.dev/fallback" || d.Env() != "HANDOFF_FALLBACK" {
		t.Errorf("annotation %q env %q", d.AnnotationKey(), d.Env())
	}
	if d, _ := config.Lookup("pod-uid"); d.AnnotationKey() != "" {
		t.Errorf("pod-uid has annotation %q, want none: it comes from the downward API", d.AnnotationKey())
	}
}

// The token-file setting is read from the variable package worker and the
// hook read, and lease-duration is bounded by the protocol's maximum.
func TestTokenFileAndLeaseDurationBound(t *testing.T) {
	d, ok := config.Lookup("token-file")
	if !ok || d.Env() != protocol.TokenFileEnv || d.Annotation {
		t.Errorf("token-file: %+v; want a setting read from %s and not an annotation", d, protocol.TokenFileEnv)
	}
	if d, _ := config.Lookup("lease-duration"); d.Env() != protocol.LeaseDurationEnv {
		t.Errorf("lease-duration is read from %s; the worker reads %s", d.Env(), protocol.LeaseDurationEnv)
	}
	_, err := config.Load(config.Map(map[string]string{"lease-duration": "61m", "renew-deadline": "10s"}, "test"))
	if err == nil || !strings.Contains(err.Error(), "above the maximum 1h0m0s") {
		t.Errorf("lease-duration 61m: %v; want it refused above the maximum", err)
	}
}

// Every duration has a maximum, so that no value, and no sum the sidecar
// makes of two of them, wraps: deadline-margin and handback-reserve of
// 2000000h each once summed to a negative reserve and were accepted. Each
// refusal names the setting, the value and the accepted form with its bound.
func TestDurationsAreBounded(t *testing.T) {
	for _, tc := range []struct {
		setting, value string
		want           []string
	}{
		{"deadline-margin", "2000000h", []string{"deadline-margin", `"2000000h"`, "above the maximum 1h0m0s", "want a duration from 0s to 1h, like 2s"}},
		{"handback-reserve", "2000000h", []string{"handback-reserve", `"2000000h"`, "above the maximum 1h0m0s", "want a duration from 0s to 1h, like 2s"}},
		{"renew-deadline", "2000000h", []string{"renew-deadline", "above the maximum 1h0m0s", "at most 1h"}},
		{"retry-period", "2000000h", []string{"retry-period", "above the maximum 1h0m0s", "at most 1h"}},
		{"grace-period", "2562047h47m17s", []string{"grace-period", "above the maximum 2562047h47m16s", "at most 2562047h47m16s (9223372036s"}},
		{"grace-period", "9223372037s", []string{"grace-period", "above the maximum 2562047h47m16s"}},
		{"grace-period", "2562047h47m16.5s", []string{"grace-period", "above the maximum 2562047h47m16s"}},
		{"deadline-margin", "-3000000h", []string{"deadline-margin", "below the minimum 0s"}},
		{"grace-period", "2562048h", []string{"grace-period", "above the maximum"}},
	} {
		_, err := config.Load(config.Map(map[string]string{tc.setting: tc.value}, "annotation"))
		if err == nil {
			t.Errorf("%s %s: accepted", tc.setting, tc.value)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s %s: error %q does not say %q", tc.setting, tc.value, err, w)
			}
		}
	}
	// The bounds themselves are accepted, and their sum does not wrap.
	s, err := config.Load(config.Map(map[string]string{"deadline-margin": "1h", "handback-reserve": "1h", "grace-period": config.MaxGracePeriod.String()}, "test"))
	if err != nil {
		t.Fatal(err)
	}
	if sum := s.DeadlineMargin + s.HandbackReserve; sum != 2*time.Hour || s.GracePeriod != config.MaxGracePeriod {
		t.Errorf("margin+reserve %s, grace period %s; want 2h and %s", sum, s.GracePeriod, config.MaxGracePeriod)
	}
	if config.MaxGracePeriod != 9223372036*time.Second || config.MaxGracePeriodSeconds != 9223372036 {
		t.Errorf("MaxGracePeriod %s (%d s): want the longest whole seconds a time.Duration holds", config.MaxGracePeriod, config.MaxGracePeriodSeconds)
	}
}
