package main

import "github.com/handoff-dev/handoff/internal/timeline"

// timelineSVG draws both replacements on one linear time axis from the
// moment the old pod was asked to stop (+0): for each, the time until a
// successor held the Lease, and the time until the last of the old pod's
// unfinished claims was claimed again (none: no bar). Durations are
// labelled in ms or s as the summary prints them. It returns a standalone
// SVG document.
func timelineSVG(with, without *replacement) []byte {
	return timeline.Picture{
		Title: "A worker pod replaced: from the stop (+0) until the work moves on",
		Groups: []timeline.Group{
			{Title: "with handoff", Bars: bars(with)},
			{Title: "without handoff (baseline)", Bars: bars(without)},
		},
	}.SVG()
}

// bars are a replacement's two bars, the Lease then the claims (blue and
// orange, by their place).
func bars(r *replacement) []timeline.Bar {
	claims := timeline.Bar{Label: "unfinished claims claimed again", Took: r.lastBack}
	if r.stranded == 0 {
		claims.None = "no unfinished claims left behind"
	}
	return []timeline.Bar{
		{Label: "Lease held by a successor", Took: r.leaseTakenAt.Sub(r.t0)},
		claims,
	}
}
