package version

import "github.com/prometheus/client_golang/prometheus"

// BuildInfoName is the metric NewBuildInfo registers.
const BuildInfoName = "handoff_build_info"

// NewBuildInfo returns the gauge handoff_build_info{component,version,
// commit,goversion}, always 1, whose labels describe this build (GetInfo):
// component is the binary's role ("sidecar" or "webhook"), version the
// release version (v0.2.0, or a dev pre-release), commit the full git
// commit ("" when unknown) and goversion the toolchain. A dashboard joins
// on it (… * on(pod) group_left(version) handoff_build_info) and an alert
// compares versions across a fleet.
func NewBuildInfo(component string) prometheus.Collector {
	info := GetInfo()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: BuildInfoName,
		Help: "1, with this build's component, release version, git commit and Go version as labels.",
		ConstLabels: prometheus.Labels{
			"component": component,
			"version":   info.Version,
			"commit":    info.Commit,
			"goversion": info.GoVersion,
		},
	}, func() float64 { return 1 })
}
