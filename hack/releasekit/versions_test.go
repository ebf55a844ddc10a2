package main

import (
	"strings"
	"testing"
)

func TestRegistryVersions(t *testing.T) {
	for _, c := range []struct {
		in               string
		python, npm, gem string
		npmDistTag       string
	}{
		{"v0.2.0", "0.2.0", "0.2.0", "0.2.0", "latest"},
		{"v1.10.3", "1.10.3", "1.10.3", "1.10.3", "latest"},
		{"v0.3.0-rc.1", "0.3.0rc1", "0.3.0-rc.1", "0.3.0.pre.rc.1", "next"},
		{"v0.3.0-rc1", "0.3.0rc1", "0.3.0-rc1", "0.3.0.pre.rc1", "next"},
		{"v0.3.0-alpha.2", "0.3.0a2", "0.3.0-alpha.2", "0.3.0.pre.alpha.2", "next"},
		{"v0.3.0-beta", "0.3.0b0", "0.3.0-beta", "0.3.0.pre.beta", "next"},
		// hack/version.sh's forms between tags and without git.
		{"v0.0.0-dev.3.gabc1234", "0.0.0.dev3+gabc1234", "0.0.0-dev.3.gabc1234", "0.0.0.pre.dev.3.gabc1234", "next"},
		{"v0.2.1-dev.12.gABC1234.dirty", "0.2.1.dev12+gabc1234.dirty", "0.2.1-dev.12.gABC1234.dirty", "0.2.1.pre.dev.12.gABC1234.dirty", "next"},
		{"v0.3.0-rc.1.dev.2.gabc1234", "0.3.0rc1.dev2+gabc1234", "0.3.0-rc.1.dev.2.gabc1234", "0.3.0.pre.rc.1.dev.2.gabc1234", "next"},
		{"v0.0.0-dev", "0.0.0.dev0", "0.0.0-dev", "0.0.0.pre.dev", "next"},
	} {
		got, err := registryVersions(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		want := versions{Python: c.python, NPM: c.npm, Gem: c.gem, NPMDistTag: c.npmDistTag}
		if got != want {
			t.Errorf("%s: %+v, want %+v", c.in, got, want)
		}
	}
}

func TestRegistryVersionsRefuses(t *testing.T) {
	for in, want := range map[string]string{
		"0.2.0":                "leading v",
		"v0.2":                 "major.minor.patch",
		"v0.2.0+build.1":       "no build metadata",
		"v01.2.0":              "semantic version",
		"v0.2.0-test.1":        `starts with "test"`,
		"v0.2.0-rc.1.my-build": `"my-build" is not alphanumeric`,
		"v0.2.0-rc01":          "leading zero",
	} {
		_, err := registryVersions(in)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "VERSION") {
			t.Errorf("%s: error %v, want one naming VERSION and saying %q", in, err, want)
		}
	}
}
