package timeline

import (
	"encoding/xml"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// wellFormed fails t unless svg parses as XML.
func wellFormed(t *testing.T, svg string) {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
	}
}

// bars are the widths of the picture's bars, in order, and their fills.
func bars(svg string) (widths []float64, fills []string) {
	for _, m := range regexp.MustCompile(`<rect x="\d+" y="\d+" width="([\d.]+)" height="\d+" fill="([^"]*)"`).FindAllStringSubmatch(svg, -1) {
		w, _ := strconv.ParseFloat(m[1], 64)
		widths, fills = append(widths, w), append(fills, m[2])
	}
	return widths, fills
}

// The picture is a well-formed SVG document with every group and bar,
// each bar as long as its duration on one axis and labelled with it, at
// least 2 wide; a bar with None is its text alone. Groups may hold any
// number of bars, and bars without a colour take one by their place.
func TestSVG(t *testing.T) {
	p := Picture{
		Title: "Three runs <compared> & drawn",
		Groups: []Group{
			{Title: "with handoff", Bars: []Bar{
				{Label: "Lease held by a successor", Took: 31 * time.Millisecond},
				{Label: "unfinished claims claimed again", Took: 2 * time.Second},
				{Label: "pod gone", Took: 4 * time.Second, Color: "#123456"},
			}},
			{Title: "without handoff (baseline)", Bars: []Bar{
				{Label: "Lease held by a successor", Took: 15200 * time.Millisecond},
				{Label: "unfinished claims claimed again", None: "no unfinished claims left behind"},
			}},
			{Title: "a third", Bars: []Bar{{Label: "negative", Took: -time.Second}}},
		},
	}
	svg := string(p.SVG())
	wellFormed(t, svg)
	for _, want := range []string{"Three runs &lt;compared&gt; &amp; drawn", "with handoff", "without handoff (baseline)", "a third",
		"Lease held by a successor +31 ms", "unfinished claims claimed again +2000 ms", "pod gone +4000 ms",
		"Lease held by a successor +15.2 s", "no unfinished claims left behind", "negative +0 ms"} {
		if !strings.Contains(svg, want) {
			t.Errorf("no %q in\n%s", want, svg)
		}
	}
	// Labels after their bars, but the longest's inside its end.
	for label, anchor := range map[string]string{"Lease held by a successor +31 ms": "start", "pod gone +4000 ms": "start",
		"Lease held by a successor +15.2 s": "end", "no unfinished claims left behind": "start"} {
		if !strings.Contains(svg, `text-anchor="`+anchor+`" fill="`+map[string]string{"start": "#222", "end": "white"}[anchor]+`">`+label+"<") {
			t.Errorf("label %q not anchored at its %s (%s)\n%s", label, anchor, map[string]string{"start": "after the bar", "end": "inside the bar's end"}[anchor], svg)
		}
	}
	if strings.Contains(svg, "claimed again +0 ms") {
		t.Errorf("the bar with None is labelled as a duration:\n%s", svg)
	}
	// Five bars: the one with None has none.
	widths, fills := bars(svg)
	if len(widths) != 5 {
		t.Fatalf("%d bars, want 5 (one has None)\n%s", len(widths), svg)
	}
	lease, claims, gone, baseline, negative := widths[0], widths[1], widths[2], widths[3], widths[4]
	if r := baseline / claims; r < 7.5 || r > 7.7 {
		t.Errorf("bar widths %.1f for 2 s and %.1f for 15.2 s: not in proportion", claims, baseline)
	}
	if r := gone / claims; r < 1.99 || r > 2.01 {
		t.Errorf("bar widths %.1f for 2 s and %.1f for 4 s: not in proportion", claims, gone)
	}
	if lease != 2 || negative != 2 {
		t.Errorf("bars of 31 ms and of a negative duration %.1f and %.1f wide; want 2, so that they show", lease, negative)
	}
	if want := []string{Colors[0], Colors[1], "#123456", Colors[0], Colors[0]}; strings.Join(fills, " ") != strings.Join(want, " ") {
		t.Errorf("fills %v, want %v (by place in the group unless given)", fills, want)
	}
	// The axis: whole seconds past the longest bar, ticks every 2 s.
	for _, want := range []string{">0 s<", ">2 s<", ">16 s<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("no axis label %q in\n%s", want, svg)
		}
	}
	if strings.Contains(svg, ">18 s<") || strings.Contains(svg, ">1 s<") {
		t.Errorf("axis past 16 s, or not in steps of 2 s:\n%s", svg)
	}
}

// A caption is wrapped under the axis and makes the picture taller; none
// adds nothing.
func TestSVGCaption(t *testing.T) {
	p := Picture{Title: "t", Groups: []Group{{Title: "g", Bars: []Bar{{Label: "a", Took: time.Second}}}}}
	plain := string(p.SVG())
	p.Caption = strings.Repeat("word ", 40) + "\nsecond & paragraph"
	captioned := string(p.SVG())
	wellFormed(t, captioned)
	if strings.Contains(plain, `font-size="11"`) {
		t.Errorf("caption lines without a caption:\n%s", plain)
	}
	lines := regexp.MustCompile(`<text x="10" y="\d+" font-size="11" fill="#444">([^<]*)</text>`).FindAllStringSubmatch(captioned, -1)
	if len(lines) != 3 || lines[2][1] != "second &amp; paragraph" {
		t.Fatalf("caption lines %q, want 200 characters wrapped in 2 and a paragraph of its own", lines)
	}
	for _, l := range lines {
		if len(l[1]) > captionMax {
			t.Errorf("caption line of %d characters, over %d: %q", len(l[1]), captionMax, l[1])
		}
	}
	height := regexp.MustCompile(`height="(\d+)"`)
	h0, _ := strconv.Atoi(height.FindStringSubmatch(plain)[1])
	h1, _ := strconv.Atoi(height.FindStringSubmatch(captioned)[1])
	if h1 != h0+3*captionH+4 {
		t.Errorf("height %d with 3 caption lines, %d without; want %d more", h1, h0, 3*captionH+4)
	}
}

func TestFormat(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                        "+0 ms",
		31 * time.Millisecond:    "+31 ms",
		9999 * time.Millisecond:  "+9999 ms",
		10 * time.Second:         "+10.0 s",
		15240 * time.Millisecond: "+15.2 s",
	} {
		if got := Format(d); got != want {
			t.Errorf("Format(%s) = %q, want %q", d, got, want)
		}
	}
}
