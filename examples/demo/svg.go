package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"time"
)

// The picture's geometry, in SVG user units (pixels).
const (
	svgWidth     = 760
	svgLabelW    = 220 // the row labels, left of the axis
	svgBarH      = 18
	svgRowGap    = 10
	svgGroupGap  = 26
	svgTop       = 40
	svgAxisSpace = 40
)

// timelineSVG draws both replacements on one linear time axis from the
// moment the old pod was asked to stop (+0): for each, the time until a
// successor held the Lease, and the time until the last of the old pod's
// unfinished claims was claimed again (none: no bar). Durations are
// labelled in ms or s as the summary prints them. It returns a standalone
// SVG document.
func timelineSVG(with, without *replacement) []byte {
	rows := []struct {
		title string
		bars  []svgBar
	}{
		{"with handoff", bars(with)},
		{"without handoff (baseline)", bars(without)},
	}
	var longest time.Duration
	for _, r := range rows {
		for _, b := range r.bars {
			longest = max(longest, b.took)
		}
	}
	longest = max(longest, time.Second)
	// The axis: whole seconds, ticks every step.
	step := time.Second
	for longest/step > 10 {
		step *= 2
	}
	end := (longest/step + 1) * step
	plotW := float64(svgWidth - svgLabelW - 20)
	x := func(d time.Duration) float64 { return svgLabelW + plotW*d.Seconds()/end.Seconds() }

	var b bytes.Buffer
	esc := func(s string) string {
		var e bytes.Buffer
		_ = xml.EscapeText(&e, []byte(s))
		return e.String()
	}
	height := svgTop + len(rows)*(2*svgBarH+svgRowGap+svgGroupGap) + svgAxisSpace
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="13">`+"\n", svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", esc("A worker pod replaced: from the stop (+0) until the work moves on"))
	y := svgTop
	for _, r := range rows {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y+svgBarH-4, esc(r.title))
		for i, bb := range r.bars {
			by := y + i*(svgBarH+svgRowGap/2)
			label := bb.label + " " + ms(bb.took)
			if bb.took < 0 {
				label = bb.none
			} else {
				w := max(x(bb.took)-svgLabelW, 2) // a bar of tens of ms still shows
				fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", svgLabelW, by, w, svgBarH, bb.color)
			}
			tx := svgLabelW + 6.0
			if bb.took >= 0 {
				tx = x(bb.took) + 6
			}
			anchor := "start"
			if tx > svgWidth-200 {
				tx, anchor = x(bb.took)-6, "end"
			}
			fill := "#222"
			if anchor == "end" {
				fill = "white"
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="%s" fill="%s">%s</text>`+"\n", tx, by+svgBarH-4, anchor, fill, esc(label))
		}
		y += 2*svgBarH + svgRowGap + svgGroupGap
	}
	// The axis.
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%.1f" y2="%d" stroke="#888"/>`+"\n", svgLabelW, y, x(end), y)
	for t := time.Duration(0); t <= end; t += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#888"/>`+"\n", x(t), y, x(t), y+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%s</text>`+"\n", x(t), y+20, fmt.Sprintf("%d s", int(t.Seconds())))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// svgBar is one bar of the picture: took from +0, negative for none.
type svgBar struct {
	label string
	took  time.Duration
	none  string // the label when there is no bar
	color string
}

// bars are a replacement's two bars: the Lease, and the claims.
func bars(r *replacement) []svgBar {
	claims := r.lastBack
	if r.stranded == 0 {
		claims = -1
	}
	return []svgBar{
		{"Lease held by a successor", r.leaseTakenAt.Sub(r.t0), "", "#2b7bb9"},
		{"unfinished claims claimed again", claims, "no unfinished claims left behind", "#e08a1e"},
	}
}
