// Package procstat reads a process's memory from /proc, for the demo and
// the benchmarks.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Memory returns the kB fields of /proc/<pid>/status (VmRSS, RssAnon,
// RssFile, VmHWM, ...) in MiB.
func Memory(pid int) (map[string]float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasSuffix(v, " kB") {
			continue
		}
		if kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(v, " kB")), 64); err == nil {
			out[k] = kb / 1024
		}
	}
	return out, nil
}
