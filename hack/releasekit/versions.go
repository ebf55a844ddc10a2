package main

import (
	"fmt"
	"regexp"
	"strings"

	"golang.org/x/mod/semver"
)

// versions is one release version as each package registry spells it.
type versions struct {
	Python     string // PEP 440: 0.2.0, 0.3.0rc1, 0.0.0.dev3+gabc1234
	NPM        string // semver without the v: 0.3.0-rc.1
	Gem        string // RubyGems: 0.3.0.pre.rc.1 (sdk/ruby/handoff.gemspec spells it so)
	NPMDistTag string // latest, or next for a prerelease
}

// releaseVersion checks that v is a release version: a semantic version
// with a leading v and no build metadata.
func releaseVersion(v string) error {
	if !semver.IsValid(v) || semver.Build(v) != "" || semver.Canonical(v) != v {
		return fmt.Errorf("VERSION %q: want a semantic version with a leading v, all of major.minor.patch and no build metadata, like v0.2.0, v0.3.0-rc.1 or v0.0.0-dev.3.gabc1234", v)
	}
	return nil
}

var (
	preTag  = regexp.MustCompile(`^(alpha|a|beta|b|rc|c)([0-9]*)$`)
	number  = regexp.MustCompile(`^(0|[1-9][0-9]*)$`)
	localID = regexp.MustCompile(`^[0-9A-Za-z]+$`)
)

// registryVersions spells v for PyPI, npm and RubyGems.
//
// Python (PEP 440) has no free-form prerelease: the semver prerelease must
// read [alpha|beta|rc[.]N][.dev.N][.LOCAL...], which covers releases
// (v0.2.0 → 0.2.0), release candidates (v0.3.0-rc.1 → 0.3.0rc1) and
// hack/version.sh's builds between tags (v0.2.1-dev.3.gabc1234 →
// 0.2.1.dev3+gabc1234; v0.3.0-rc.1.dev.2.gabc1234.dirty →
// 0.3.0rc1.dev2+gabc1234.dirty). The local part after "+" is refused by
// PyPI, as it should: only a tag's version is published.
func registryVersions(v string) (versions, error) {
	if err := releaseVersion(v); err != nil {
		return versions{}, err
	}
	bare := strings.TrimPrefix(v, "v")
	out := versions{NPM: bare, Gem: strings.Replace(bare, "-", ".pre.", 1), NPMDistTag: "latest"}
	core, pre, _ := strings.Cut(bare, "-")
	if pre == "" {
		out.Python = core
		return out, nil
	}
	out.NPMDistTag = "next"
	bad := func(why string) (versions, error) {
		return versions{}, fmt.Errorf("VERSION %q: its prerelease %q has no Python (PEP 440) form: %s; want [alpha|beta|rc.N][.dev.N] and then any alphanumeric identifiers, like v0.3.0-rc.1, v0.3.0-beta.2.dev.1.gabc1234 or v0.0.0-dev.3.gabc1234", v, pre, why)
	}
	ids := strings.Split(pre, ".")
	py := core
	i := 0
	if m := preTag.FindStringSubmatch(ids[0]); m != nil {
		letter := map[string]string{"alpha": "a", "a": "a", "beta": "b", "b": "b", "rc": "rc", "c": "rc"}[m[1]]
		n := m[2]
		i = 1
		if n == "" && len(ids) > 1 && number.MatchString(ids[1]) {
			n, i = ids[1], 2
		}
		if n == "" {
			n = "0"
		}
		if !number.MatchString(n) {
			return bad(fmt.Sprintf("%q has a number with a leading zero", ids[0]))
		}
		py += letter + n
	}
	if i < len(ids) && ids[i] == "dev" {
		n := "0"
		i++
		if i < len(ids) && number.MatchString(ids[i]) {
			n = ids[i]
			i++
		}
		py += ".dev" + n
	}
	if i == 0 {
		return bad(fmt.Sprintf("it starts with %q", ids[0]))
	}
	if i < len(ids) {
		local := ids[i:]
		for _, id := range local {
			if !localID.MatchString(id) {
				return bad(fmt.Sprintf("%q is not alphanumeric", id))
			}
		}
		py += "+" + strings.ToLower(strings.Join(local, "."))
	}
	out.Python = py
	return out, nil
}
