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
	return kB(fmt.Sprintf("/proc/%d/status", pid))
}

// Rollup returns the kB fields of /proc/<pid>/smaps_rollup (Rss, Pss,
// Pss_Anon, Pss_File, Anonymous, Private_Clean, Private_Dirty, ...) in MiB:
// the process's mappings summed by the kernel. Pss charges each shared page
// to the processes that map it in equal parts; Anonymous is memory that is
// not pages of a file (heap, stacks, the binary's written data).
func Rollup(pid int) (map[string]float64, error) {
	return kB(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
}

// kB reads the "Name: N kB" lines of a /proc file, in MiB.
func kB(path string) (map[string]float64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasSuffix(v, " kB") {
			continue
		}
		if n, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(v, " kB")), 64); err == nil {
			out[k] = n / 1024
		}
	}
	return out, nil
}
