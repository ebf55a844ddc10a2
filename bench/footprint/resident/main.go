// Command resident says which pages of a running Go program's binary are
// resident: by ELF section, and within .text by Go package, from
// /proc/<pid>/maps and /proc/<pid>/pagemap (present bit only, which needs
// no privilege beyond reading the process). Given a second process, it
// prints the difference: how bench/footprint's sidecar and floor were told
// apart (docs/performance.md, Footprint).
//
// The binary's symbols are read from -binary, an unstripped build of the
// same code as the running one (the Makefile's -s -w drops them); the
// running binary, when it has them. Run both processes from unstripped
// builds (bench/footprint -floor and --handoff take paths) so that the
// addresses match.
//
// Usage: go run ./bench/footprint/resident -pid PID [-binary PATH]
// [-base-pid PID -base-binary PATH] [-top 40]
package main

import (
	"cmp"
	"debug/elf"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

const page = 4096

var (
	pid        = flag.Int("pid", 0, "the process measured")
	bin        = flag.String("binary", "", "an unstripped build of its binary; empty reads /proc/PID/exe")
	basePid    = flag.Int("base-pid", 0, "a second process, subtracted from the first (0: none)")
	baseBin    = flag.String("base-binary", "", "an unstripped build of the second process's binary; empty reads /proc/BASE-PID/exe")
	top        = flag.Int("top", 40, "packages printed, largest difference first")
	errNoSyms  = errors.New("no symbol table (a build with -s -w): pass -binary, an unstripped build of the same code")
	errNoPages = errors.New("no page of the binary is mapped")
)

func main() {
	flag.Parse()
	if *pid <= 0 {
		fmt.Fprintln(os.Stderr, "resident: -pid: required, the process measured")
		os.Exit(2)
	}
	a, err := measure(*pid, *bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "resident:", err)
		os.Exit(1)
	}
	b := &footprint{sections: map[string]int{}, packages: map[string]float64{}}
	if *basePid > 0 {
		if b, err = measure(*basePid, *baseBin); err != nil {
			fmt.Fprintln(os.Stderr, "resident: base:", err)
			os.Exit(1)
		}
	}
	report(a, b, *basePid > 0)
}

// footprint is one process's resident pages of its binary: bytes by
// section, and bytes of .text by package.
type footprint struct {
	sections map[string]int
	packages map[string]float64
	total    int
}

func measure(pid int, path string) (*footprint, error) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return nil, err
	}
	if path == "" {
		path = fmt.Sprintf("/proc/%d/exe", pid)
	}
	pages, err := residentPages(pid, exe)
	if err != nil {
		return nil, err
	}
	if len(pages) == 0 {
		return nil, fmt.Errorf("pid %d: %w", pid, errNoPages)
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	syms, err := f.Symbols()
	if err != nil || len(syms) == 0 {
		return nil, fmt.Errorf("%s: %w", path, errNoSyms)
	}
	var text []elf.Symbol
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 {
			text = append(text, s)
		}
	}
	slices.SortFunc(text, func(x, y elf.Symbol) int { return cmp.Compare(x.Value, y.Value) })
	fp := &footprint{sections: map[string]int{}, packages: map[string]float64{}}
	for _, p := range pages {
		name := "(none)"
		for _, s := range f.Sections {
			if s.Flags&elf.SHF_ALLOC != 0 && s.Addr <= p && p < s.Addr+s.Size {
				name = s.Name
				break
			}
		}
		fp.sections[name] += page
		fp.total += page
		if name != ".text" {
			continue
		}
		// Each function's share of the page, by the bytes it has in it.
		i, _ := slices.BinarySearchFunc(text, p, func(s elf.Symbol, a uint64) int { return cmp.Compare(s.Value, a) })
		if i > 0 {
			i--
		}
		for ; i < len(text) && text[i].Value < p+page; i++ {
			lo, hi := max(p, text[i].Value), min(p+page, text[i].Value+text[i].Size)
			if hi > lo {
				fp.packages[pkg(text[i].Name)] += float64(hi - lo)
			}
		}
	}
	return fp, nil
}

// residentPages returns the addresses of the present pages of pid's
// mappings of the file exe.
func residentPages(pid int, exe string) ([]uint64, error) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, err
	}
	defer func() { _ = pm.Close() }()
	var pages []uint64
	for line := range strings.Lines(string(maps)) {
		f := strings.Fields(line)
		if len(f) < 6 || f[5] != exe {
			continue
		}
		from, to, _ := strings.Cut(f[0], "-")
		lo, err1 := strconv.ParseUint(from, 16, 64)
		hi, err2 := strconv.ParseUint(to, 16, 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("/proc/%d/maps: %q: %w", pid, f[0], err)
		}
		buf := make([]byte, (hi-lo)/page*8)
		if _, err := pm.ReadAt(buf, int64(lo/page*8)); err != nil {
			return nil, fmt.Errorf("/proc/%d/pagemap: %w", pid, err)
		}
		for i := range (hi - lo) / page {
			if binary.LittleEndian.Uint64(buf[i*8:])>>63 == 1 {
				pages = append(pages, lo+i*page)
			}
		}
	}
	return pages, nil
}

// pkg is the Go package of a symbol: its path up to the first dot after
// the last slash (generic instantiations are counted under the package
// that names them first).
func pkg(sym string) string {
	name, _, _ := strings.Cut(sym, "[")
	i := strings.LastIndexByte(name, '/')
	if j := strings.IndexByte(name[i+1:], '.'); j >= 0 {
		return name[:i+1+j]
	}
	return name
}

func report(a, b *footprint, diff bool) {
	mib := func(n int) float64 { return float64(n) / (1 << 20) }
	names := slices.Sorted(func(yield func(string) bool) {
		seen := map[string]bool{}
		for _, m := range []map[string]int{a.sections, b.sections} {
			for k := range m {
				if !seen[k] && !yield(k) {
					return
				}
				seen[k] = true
			}
		}
	})
	fmt.Println("resident pages of the binary, MiB, by section")
	for _, n := range names {
		if diff {
			fmt.Printf("  %-14s %7.2f %7.2f %+7.2f\n", n, mib(b.sections[n]), mib(a.sections[n]), mib(a.sections[n]-b.sections[n]))
		} else {
			fmt.Printf("  %-14s %7.2f\n", n, mib(a.sections[n]))
		}
	}
	if diff {
		fmt.Printf("  %-14s %7.2f %7.2f %+7.2f   (base, process, difference)\n", "all", mib(b.total), mib(a.total), mib(a.total-b.total))
	} else {
		fmt.Printf("  %-14s %7.2f\n", "all", mib(a.total))
	}
	keys := map[string]bool{}
	for k := range a.packages {
		keys[k] = true
	}
	for k := range b.packages {
		keys[k] = true
	}
	pkgs := slices.SortedFunc(func(yield func(string) bool) {
		for k := range keys {
			if !yield(k) {
				return
			}
		}
	}, func(x, y string) int {
		return cmp.Or(cmp.Compare(a.packages[y]-b.packages[y], a.packages[x]-b.packages[x]), cmp.Compare(x, y))
	})
	fmt.Println("resident .text by package, KiB (largest difference first)")
	for _, k := range pkgs[:min(*top, len(pkgs))] {
		if diff {
			fmt.Printf("  %+7.0f %7.0f %7.0f  %s\n", (a.packages[k]-b.packages[k])/1024, b.packages[k]/1024, a.packages[k]/1024, k)
		} else {
			fmt.Printf("  %7.0f  %s\n", a.packages[k]/1024, k)
		}
	}
}
