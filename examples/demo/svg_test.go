package main

import (
	"encoding/xml"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The picture is a well-formed SVG document with both rows, each bar as
// long as its duration on one axis, labelled as the summary labels it; a
// replacement that left no claims has no claims bar.
func TestTimelineSVG(t *testing.T) {
	t0 := time.Now()
	with := &replacement{handoff: true, t0: t0, leaseTakenAt: t0.Add(31 * time.Millisecond), stranded: 3, lastBack: 2 * time.Second}
	without := &replacement{t0: t0, leaseTakenAt: t0.Add(15200 * time.Millisecond), stranded: 0}
	svg := string(timelineSVG(with, without))

	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := dec.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("not well-formed XML: %v\n%s", err, svg)
			}
			break
		}
	}
	for _, want := range []string{"with handoff", "without handoff (baseline)", "Lease held by a successor +31 ms", "Lease held by a successor +15.2 s",
		"unfinished claims claimed again +2000 ms", "no unfinished claims left behind"} {
		if !strings.Contains(svg, want) {
			t.Errorf("no %q in\n%s", want, svg)
		}
	}
	// Three bars: two Leases and one claims; widths in proportion.
	var widths []float64
	for _, m := range regexp.MustCompile(`<rect x="\d+" y="\d+" width="([\d.]+)"`).FindAllStringSubmatch(svg, -1) {
		w, _ := strconv.ParseFloat(m[1], 64)
		widths = append(widths, w)
	}
	if len(widths) != 3 {
		t.Fatalf("%d bars, want 3 (the baseline left no claims)\n%s", len(widths), svg)
	}
	lease, claims, baseline := widths[0], widths[1], widths[2]
	if r := baseline / claims; r < 7.2 || r > 8 || lease != 2 {
		t.Errorf("bar widths: handoff's Lease %.1f, its claims %.1f, the baseline's Lease %.1f; want the last two in proportion to 2 s and 15.2 s, and 31 ms shown 2 wide (at least 2, so that it shows)", lease, claims, baseline)
	}
}
