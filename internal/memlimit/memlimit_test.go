package memlimit_test

import (
	"math"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/internal/memlimit"
)

func TestSet(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	for _, tc := range []struct {
		name string
		env  map[string]string
		want memlimit.Result
		err  string
	}{
		{"the injected 128 MiB", map[string]string{memlimit.EnvVar: "134217728"},
			memlimit.Result{Limit: 96 << 20, Container: 128 << 20, Source: memlimit.EnvVar}, ""},
		{"the largest", map[string]string{memlimit.EnvVar: "9223372036854775807"},
			memlimit.Result{Limit: math.MaxInt64 / 4 * 3, Container: math.MaxInt64, Source: memlimit.EnvVar}, ""},
		{"GOMEMLIMIT wins", map[string]string{"GOMEMLIMIT": "50MiB", memlimit.EnvVar: "134217728"},
			memlimit.Result{Limit: math.MaxInt64, Source: "GOMEMLIMIT"}, ""},
		{"neither", nil, memlimit.Result{Limit: math.MaxInt64}, ""},
		{"zero", map[string]string{memlimit.EnvVar: "0"}, memlimit.Result{}, `HANDOFF_MEMORY_LIMIT: invalid value "0": want the container's memory limit in bytes, a whole number from 1`},
		{"a quantity", map[string]string{memlimit.EnvVar: "128Mi"}, memlimit.Result{}, `invalid value "128Mi"`},
		{"past int64", map[string]string{memlimit.EnvVar: "9223372036854775808"}, memlimit.Result{}, "invalid value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64) // as the runtime starts without GOMEMLIMIT
			got, err := memlimit.Set(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Set = %+v, %v; want an error saying %q", got, err, tc.err)
				}
				if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
					t.Errorf("the runtime's limit is %d after an error; want it unchanged", l)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Set = %+v, %v; want %+v", got, err, tc.want)
			}
			if l := debug.SetMemoryLimit(-1); l != tc.want.Limit {
				t.Errorf("the runtime's limit is %d; want %d", l, tc.want.Limit)
			}
		})
	}
}
