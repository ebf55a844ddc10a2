// Package version is the release version of this build of handoff, the one
// version string that bin/handoff, bin/handoff-sidecar, the image tags, the
// chart and every injected pod (the annotation handoff.dev/version) carry.
//
// Its one source is the git tag: hack/version.sh prints it (vX.Y.Z on a
// tagged commit, a vX.Y.Z-dev.N.gSHA pre-release between tags), and the
// Makefile stamps it with
//
//	-ldflags "-X github.com/handoff-dev/handoff/version.version=$(VERSION)
//	          -X github.com/handoff-dev/handoff/version.commit=$(COMMIT)"
//
// A build without those flags (go install github.com/handoff-dev/handoff/cmd/handoff@v0.2.0,
// or a plain go build) takes them from the build information the go command
// records (runtime/debug.ReadBuildInfo): the main module's version, which
// is the tag for go install …@vX.Y.Z, and the VCS revision when it was
// stamped (-buildvcs). Neither there: "dev".
package version

import (
	"runtime"
	"runtime/debug"
	"strings"

	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// Stamped by -ldflags -X (see the package comment); empty when not.
var (
	version string
	commit  string
)

// Dev is the version of a build that carries none: built without -ldflags
// and outside a module version or VCS stamp.
const Dev = "dev"

// Info describes this build. Its JSON form is part of `handoff version -o
// json` and stays as it is.
type Info struct {
	// Version is the release version, like v0.2.0 or
	// v0.2.1-dev.3.g1a2b3c4 (Get).
	Version string `json:"version"`
	// Commit is the full git commit hash the build is from, "" when unknown
	// (a go install from the module proxy records none).
	Commit string `json:"commit,omitempty"`
	// GoVersion is the Go toolchain that built it, like go1.27.3.
	GoVersion string `json:"goVersion"`
	// Platform is the operating system and architecture it runs on,
	// GOOS/GOARCH, like linux/arm64.
	Platform string `json:"platform"`
}

// Get returns the release version of this build: the one stamped by
// -ldflags, else the main module's version from the build information
// (build metadata turned into a pre-release: v0.2.0+dirty becomes
// v0.2.0-dirty, so that it stays a valid image tag and label value), else
// a v0.0.0-dev.gSHA pre-release from the VCS revision the go command
// recorded, else Dev.
func Get() string {
	bi, _ := debug.ReadBuildInfo()
	return fromBuild(version, bi)
}

// GetInfo returns this build's version, commit, Go version and platform.
func GetInfo() Info {
	bi, _ := debug.ReadBuildInfo()
	return Info{
		Version:   fromBuild(version, bi),
		Commit:    commitFromBuild(commit, bi),
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// fromBuild is Get for the stamped version and the build information bi
// (nil when the binary has none).
func fromBuild(stamped string, bi *debug.BuildInfo) string {
	if stamped != "" {
		return stamped
	}
	if bi == nil {
		return Dev
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return withoutBuildMetadata(v)
	}
	if rev := setting(bi, "vcs.revision"); rev != "" {
		v := "v0.0.0-dev.g" + rev[:min(len(rev), 12)]
		if setting(bi, "vcs.modified") == "true" {
			v += ".dirty"
		}
		return v
	}
	return Dev
}

// commitFromBuild is the stamped commit, else the VCS revision in bi.
func commitFromBuild(stamped string, bi *debug.BuildInfo) string {
	if stamped != "" || bi == nil {
		return stamped
	}
	return setting(bi, "vcs.revision")
}

func setting(bi *debug.BuildInfo, key string) string {
	for _, s := range bi.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

// withoutBuildMetadata moves a semantic version's build metadata (after
// "+", which go build appends as +dirty for a modified tree) into its
// pre-release: v1.2.3+dirty is v1.2.3-dirty, and
// v0.0.0-20261203124216-2c1ee26e64e7+dirty is
// v0.0.0-20261203124216-2c1ee26e64e7.dirty. Neither an image tag nor a
// label value may hold "+".
func withoutBuildMetadata(v string) string {
	base, meta, ok := strings.Cut(v, "+")
	if !ok {
		return v
	}
	if strings.Contains(base, "-") {
		return base + "." + meta
	}
	return base + "-" + meta
}

// Released reports whether v is a release's version, as hack/version.sh
// prints it for a tagged commit: a semantic version vX.Y.Z or vX.Y.Z-PRE
// whose pre-release is not a development build's (no "dev" or "dirty"
// identifier) and which is not a Go pseudo-version
// (v0.0.0-20261203124216-2c1ee26e64e7). Only a released version has
// published images.
func Released(v string) bool {
	// Canonical: vX.Y.Z in full, no build metadata.
	if !semver.IsValid(v) || semver.Canonical(v) != v || module.IsPseudoVersion(v) {
		return false
	}
	for id := range strings.SplitSeq(strings.TrimPrefix(semver.Prerelease(v), "-"), ".") {
		if id == "dev" || id == "dirty" {
			return false
		}
	}
	return true
}

// DocsBase is where a build's documentation lives: the repository's tree
// at its release's tag (https://github.com/handoff-dev/handoff/blob/v0.2.0/)
// for a released version, else at main (a development build's docs are
// the newest). Add a path within the repository, like docs/checks.md#id.
func DocsBase(v string) string {
	ref := "main"
	if Released(v) {
		ref = v
	}
	return "https://github.com/handoff-dev/handoff/blob/" + ref + "/"
}
