// Package timeline draws timelines as SVG pictures: groups of bars on one
// linear time axis from +0, each bar a duration from +0 labelled in ms or s,
// so that two runs (say, with handoff and the baseline) read side by side.
package timeline

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"strings"
	"time"
)

// Picture is a timeline picture: a title, groups of bars on one time axis,
// and an optional caption under the axis.
type Picture struct {
	Title  string
	Groups []Group
	// Caption is text under the axis (what +0 is, which figures were
	// chosen), wrapped to the picture's width; empty: none.
	Caption string
}

// Group is a titled set of bars, one under another: one run.
type Group struct {
	Title string // left of its first bar: "with handoff"
	Bars  []Bar
}

// Bar is one duration from +0.
type Bar struct {
	// Label is the bar's text before its duration: "Lease held by a
	// successor" reads "Lease held by a successor +31 ms".
	Label string
	// Took is the bar's length, from +0 (a negative one counts as 0).
	Took time.Duration
	// None, if set, means there is no duration: no bar is drawn, and None
	// is the text in its place ("no unfinished claims left behind").
	None string
	// Color is the bar's fill, an SVG colour; empty: by the bar's place in
	// its group, blue, orange, green, red, then again.
	Color string
}

// Colors are the bars' fills by their place in a group, when a Bar has none.
var Colors = []string{"#2b7bb9", "#e08a1e", "#3a9a4a", "#c8413b"}

// The picture's geometry, in SVG user units (pixels).
const (
	width      = 760
	labelW     = 220 // the group titles, left of the axis
	barH       = 18
	barGap     = 5 // between the bars of a group
	groupGap   = 26
	top        = 40
	axisSpace  = 40
	captionH   = 15  // a caption line, at font-size 11
	captionMax = 120 // characters in a caption line
)

// SVG draws the picture as a standalone SVG document, width 760: the
// groups in order, each bar from +0 to its duration on one linear axis in
// whole seconds, at least 2 s long, and at least 2 pixels wide so that a
// bar of a few ms still shows. A bar's label, its duration as Format gives
// it, is after the bar's end, or inside it (white) where it would run off
// the picture after it.
func (p Picture) SVG() []byte {
	var longest time.Duration
	for _, g := range p.Groups {
		for _, bar := range g.Bars {
			if bar.None == "" {
				longest = max(longest, bar.Took)
			}
		}
	}
	longest = max(longest, time.Second)
	// The axis: whole seconds, ticks every step, at most 10 of them.
	step := time.Second
	for longest/step > 10 {
		step *= 2
	}
	end := (longest/step + 1) * step
	plotW := float64(width - labelW - 20)
	x := func(d time.Duration) float64 { return labelW + plotW*d.Seconds()/end.Seconds() }

	height := top + axisSpace
	for _, g := range p.Groups {
		height += len(g.Bars)*(barH+barGap) + groupGap
	}
	caption := wrap(p.Caption, captionMax)
	if len(caption) > 0 {
		height += len(caption)*captionH + 4
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="13">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", esc(p.Title))
	y := top
	for _, g := range p.Groups {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y+barH-4, esc(g.Title))
		for i, bar := range g.Bars {
			by := y + i*(barH+barGap)
			took := max(bar.Took, 0)
			label := bar.Label + " " + Format(took)
			tx, anchor, fill := labelW+6.0, "start", "#222"
			if bar.None != "" {
				label = bar.None
			} else {
				color := bar.Color
				if color == "" {
					color = Colors[i%len(Colors)]
				}
				w := max(x(took)-labelW, 2)
				fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelW, by, w, barH, esc(color))
				// The label after the bar, or inside its end if it would
				// run off the picture after it and fits inside.
				tx = x(took) + 6
				if est := textW(label); tx+est > width-4 && w-12 >= est {
					tx, anchor, fill = x(took)-6, "end", "white"
				}
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="%s" fill="%s">%s</text>`+"\n", tx, by+barH-4, anchor, fill, esc(label))
		}
		y += len(g.Bars)*(barH+barGap) + groupGap
	}
	// The axis.
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%.1f" y2="%d" stroke="#888"/>`+"\n", labelW, y, x(end), y)
	for t := time.Duration(0); t <= end; t += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#888"/>`+"\n", x(t), y, x(t), y+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%s</text>`+"\n", x(t), y+20, fmt.Sprintf("%d s", int(t.Seconds())))
	}
	for i, line := range caption {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-size="11" fill="#444">%s</text>`+"\n", y+axisSpace+i*captionH, esc(line))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// Format is d as a bar's label gives it: "+31 ms" under 10 s, "+15.2 s"
// from 10 s.
func Format(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("+%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("+%.1f s", d.Seconds())
}

// textW is about how wide s is drawn at font-size 13 (sans-serif, 6.8
// pixels a character on average, and some to spare).
func textW(s string) float64 { return 7.2 * float64(len([]rune(s))) }

// esc is s escaped as XML text or attribute value.
func esc(s string) string {
	var e bytes.Buffer
	_ = xml.EscapeText(&e, []byte(s))
	return e.String()
}

// wrap splits s into lines of at most n characters (runes) at spaces, and
// at its newlines; a longer word is a line of its own.
func wrap(s string, n int) []string {
	var lines []string
	for _, para := range strings.Split(s, "\n") {
		line := ""
		for _, w := range strings.Fields(para) {
			switch {
			case line == "":
				line = w
			case len([]rune(line))+1+len([]rune(w)) <= n:
				line += " " + w
			default:
				lines = append(lines, line)
				line = w
			}
		}
		if line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}
