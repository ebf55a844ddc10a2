// Command releasekit holds what hack/release.sh needs beyond shell: the
// release version in each package registry's spelling, the release notes
// from the CHANGELOG, and the check of a release's files.
//
// Usage (from the repository's root, as hack/release.sh runs it):
//
//	go run ./hack/releasekit versions VERSION
//	    Prints KEY=VALUE lines for the shell: PYTHON_VERSION (PEP 440),
//	    NPM_VERSION (semver without the v), GEM_VERSION (RubyGems'), and
//	    NPM_DIST_TAG (latest for a release, next for a prerelease, so that
//	    `npm install @handoff-dev/worker` never gets a prerelease).
//	go run ./hack/releasekit notes [-changelog FILE] VERSION
//	    Prints the release notes of VERSION: the body of the CHANGELOG's
//	    section whose heading starts with VERSION ("## v0.2.0 (2026-12-10)").
//	    A prerelease without a section of its own takes its release's
//	    ("## v0.2.0"), else the "## Unreleased" section; a release without
//	    its section is an error (write it before tagging).
//	go run ./hack/releasekit verify -dir DIR [-list FILE] VERSION
//	    Checks a release's assets (hack/release.sh checksums makes DIR,
//	    dist/release): checksums.txt names every other file of DIR once
//	    (its signature, checksums.txt.sig or .bundle, aside) with its
//	    SHA-256; every file is a known asset at VERSION, its version read
//	    from inside it (a binary's build information, a chart's Chart.yaml,
//	    a wheel's METADATA, an sdist's PKG-INFO, an npm package's
//	    package.json, a gem's metadata, the krew manifest); and either no
//	    SBOM or one per binary and SDK package (NAME.spdx.json), each an
//	    SPDX document that names VERSION. -list writes each asset's name,
//	    size in bytes and SHA-256, a line each.
//
// VERSION is a semantic version with a leading v and no build metadata
// (v0.2.0, v0.3.0-rc.1, v0.0.0-dev.3.gabc1234: hack/version.sh's forms).
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "versions":
		if len(args) != 1 {
			usage()
		}
		var v versions
		if v, err = registryVersions(args[0]); err == nil {
			fmt.Printf("PYTHON_VERSION=%s\nNPM_VERSION=%s\nGEM_VERSION=%s\nNPM_DIST_TAG=%s\n", v.Python, v.NPM, v.Gem, v.NPMDistTag)
		}
	case "notes":
		fl := flag.NewFlagSet("notes", flag.ExitOnError)
		changelog := fl.String("changelog", "CHANGELOG.md", "the changelog to read")
		_ = fl.Parse(args)
		if fl.NArg() != 1 {
			usage()
		}
		var data []byte
		if data, err = os.ReadFile(*changelog); err == nil {
			var n string
			if n, err = releaseNotes(string(data), fl.Arg(0)); err == nil {
				fmt.Print(n)
			}
		}
	case "verify":
		fl := flag.NewFlagSet("verify", flag.ExitOnError)
		dir := fl.String("dir", "", "the release's assets (dist/release)")
		list := fl.String("list", "", "a file to write each asset's name, size and SHA-256 to")
		_ = fl.Parse(args)
		if *dir == "" || fl.NArg() != 1 {
			usage()
		}
		var assets []asset
		if assets, err = verify(*dir, fl.Arg(0)); err == nil && *list != "" {
			err = writeList(*list, assets)
		}
		if err == nil {
			fmt.Fprintf(os.Stderr, "releasekit: %d assets in %s at %s verified\n", len(assets), *dir, fl.Arg(0))
		}
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "releasekit:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: go run ./hack/releasekit versions VERSION | notes [-changelog FILE] VERSION | verify -dir DIR [-list FILE] VERSION")
	os.Exit(2)
}
