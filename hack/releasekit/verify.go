package main

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// asset is one file of a release.
type asset struct {
	Name   string
	Size   int64
	SHA256 string
	Kind   string // binary, krew archive, krew manifest, license, chart, wheel, sdist, npm package, gem, SBOM, checksums, signature
}

// The checksums file and its signature (SIGN=key: .sig; keyless: .bundle).
const checksumsName = "checksums.txt"

var signatureNames = []string{checksumsName + ".sig", checksumsName + ".bundle"}

// maxMember bounds what verify reads of one file inside an archive.
const maxMember = 256 << 20

// verify checks the release assets in dir at version v (the package main
// comment says what) and returns them sorted by name.
func verify(dir, v string) ([]asset, error) {
	reg, err := registryVersions(v)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	sums, err := readChecksums(filepath.Join(dir, checksumsName))
	if err != nil {
		return nil, err
	}
	var (
		assets []asset
		errs   []error
		sboms  = map[string]bool{} // the assets that have an SBOM
		needs  []string            // the assets that need one
	)
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(dir, name)
		if !e.Type().IsRegular() {
			errs = append(errs, fmt.Errorf("%s: not a regular file (a release's assets are files side by side, as on the GitHub release)", path))
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sum := sha256.Sum256(data)
		a := asset{Name: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
		switch {
		case name == checksumsName:
			a.Kind = "checksums"
		case slices.Contains(signatureNames, name):
			a.Kind = "signature"
		default:
			want, listed := sums[name]
			delete(sums, name)
			if !listed {
				errs = append(errs, fmt.Errorf("%s: not in %s", name, checksumsName))
			} else if want != a.SHA256 {
				errs = append(errs, fmt.Errorf("%s: SHA-256 %s, %s says %s", name, a.SHA256, checksumsName, want))
			}
			var sbom bool
			a.Kind, sbom, err = checkAsset(name, data, v, reg)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
			if sbom {
				needs = append(needs, name)
			}
			if a.Kind == "SBOM" {
				sboms[strings.TrimSuffix(name, ".spdx.json")] = true
			}
		}
		assets = append(assets, a)
	}
	for name := range sums {
		errs = append(errs, fmt.Errorf("%s names %s, which is not in %s", checksumsName, name, dir))
	}
	if len(sboms) > 0 {
		for _, n := range needs {
			if !sboms[n] {
				errs = append(errs, fmt.Errorf("%s: no SBOM (%s.spdx.json) where the other binaries and packages have one", n, n))
			}
			delete(sboms, n)
		}
		for n := range sboms {
			errs = append(errs, fmt.Errorf("%s.spdx.json: an SBOM of no binary or SDK package of the release", n))
		}
	}
	if len(assets) == 0 {
		errs = append(errs, fmt.Errorf("%s: no assets", dir))
	}
	slices.SortFunc(assets, func(a, b asset) int { return strings.Compare(a.Name, b.Name) })
	return assets, errors.Join(errs...)
}

// readChecksums reads sha256sum's output: "HEX  NAME" (or "HEX *NAME"), a
// file name once, no directory.
func readChecksums(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	line := regexp.MustCompile(`^([0-9a-f]{64}) [ *]([^/]+)$`)
	sums := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			return nil, fmt.Errorf("%s:%d: %q: want sha256sum's \"HEX  NAME\" with a file name and no directory", path, n, sc.Text())
		}
		if _, dup := sums[m[2]]; dup {
			return nil, fmt.Errorf("%s:%d: %s listed twice", path, n, m[2])
		}
		sums[m[2]] = m[1]
	}
	if len(sums) == 0 {
		return nil, fmt.Errorf("%s: empty", path)
	}
	return sums, sc.Err()
}

var (
	binaryName = regexp.MustCompile(`^handoff-(linux|darwin)-(amd64|arm64)$`)
	krewName   = regexp.MustCompile(`^kubectl-handoff-(linux|darwin)-(amd64|arm64)\.tar\.gz$`)
)

// checkAsset checks one asset by its name's kind, its version read from
// inside it, and says whether the release's SBOMs must cover it.
func checkAsset(name string, data []byte, v string, reg versions) (kind string, sbom bool, err error) {
	switch {
	case binaryName.MatchString(name):
		return "binary", true, checkBinary(name, data, v)
	case krewName.MatchString(name):
		files, err := untar(data, "kubectl-handoff", "LICENSE")
		if err != nil {
			return "krew archive", false, err
		}
		return "krew archive", false, checkBinary("handoff-"+strings.TrimSuffix(strings.TrimPrefix(name, "kubectl-handoff-"), ".tar.gz"), files["kubectl-handoff"], v)
	case name == "handoff.yaml":
		var m struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Spec       struct {
				Version string `json:"version"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(data, &m); err != nil {
			return "krew manifest", false, err
		}
		if m.Kind != "Plugin" || m.Spec.Version != v {
			return "krew manifest", false, fmt.Errorf("kind %q, spec.version %q: want a krew Plugin at %s", m.Kind, m.Spec.Version, v)
		}
		return "krew manifest", false, nil
	case name == "LICENSE":
		if !bytes.Contains(data, []byte("Apache License")) {
			return "license", false, errors.New("not the Apache License")
		}
		return "license", false, nil
	case name == "handoff-"+v+".tgz" || name == "handoff-workload-"+v+".tgz":
		chart := strings.TrimSuffix(name, "-"+v+".tgz")
		files, err := untar(data, chart+"/Chart.yaml")
		if err != nil {
			return "chart", false, err
		}
		var c struct {
			Name       string `json:"name"`
			Version    string `json:"version"`
			AppVersion string `json:"appVersion"`
		}
		if err := yaml.Unmarshal(files[chart+"/Chart.yaml"], &c); err != nil {
			return "chart", false, err
		}
		if c.Name != chart || c.Version != v || c.AppVersion != v {
			return "chart", false, fmt.Errorf("its Chart.yaml: name %q, version %q, appVersion %q: want %s at %s", c.Name, c.Version, c.AppVersion, chart, v)
		}
		return "chart", false, nil
	case name == "handoff-"+reg.Python+"-py3-none-any.whl":
		return "wheel", true, checkWheel(data, reg.Python)
	case name == "handoff-"+reg.Python+".tar.gz":
		pkgInfo := "handoff-" + reg.Python + "/PKG-INFO"
		files, err := untar(data, pkgInfo)
		if err != nil {
			return "sdist", true, err
		}
		return "sdist", true, checkPythonMetadata(files[pkgInfo], reg.Python)
	case name == "handoff-dev-worker-"+reg.NPM+".tgz" || name == "handoff-dev-bullmq-"+reg.NPM+".tgz":
		return "npm package", true, checkNPM(name, data, reg.NPM)
	case name == "handoff-"+reg.Gem+".gem":
		return "gem", true, checkGem(data, reg.Gem)
	case strings.HasSuffix(name, ".spdx.json"):
		return "SBOM", false, checkSBOM(data, v)
	}
	return "", false, fmt.Errorf("not an asset of release %s (binaries handoff-OS-ARCH, krew archives and handoff.yaml, LICENSE, charts handoff-%s.tgz, the wheel and sdist at %s, npm packages at %s, the gem at %s, SBOMs NAME.spdx.json)", v, v, reg.Python, reg.NPM, reg.Gem)
}

// checkBinary: the Go binary of cmd/handoff for the platform in its
// name (binaryName's OS and ARCH), holding version v: the string the
// release's -X of version.version puts in its data (a -trimpath build
// records no -ldflags in its build information; where it does, they must
// set v).
func checkBinary(name string, data []byte, v string) error {
	bi, err := buildinfo.Read(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("no Go build information: %w", err)
	}
	if bi.Path != "github.com/handoff-dev/handoff/cmd/handoff" {
		return fmt.Errorf("the build of %s: want github.com/handoff-dev/handoff/cmd/handoff", bi.Path)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if m := binaryName.FindStringSubmatch(name); m != nil && (settings["GOOS"] != m[1] || settings["GOARCH"] != m[2]) {
		return fmt.Errorf("built for %s/%s: want %s/%s", settings["GOOS"], settings["GOARCH"], m[1], m[2])
	}
	if ld, ok := settings["-ldflags"]; ok && !slices.Contains(strings.Fields(ld), "github.com/handoff-dev/handoff/version.version="+v) {
		return fmt.Errorf("built with -ldflags %q: want version.version=%s", ld, v)
	}
	if !bytes.Contains(data, []byte(v)) {
		return fmt.Errorf("holds no %s: want it built with -X github.com/handoff-dev/handoff/version.version=%s", v, v)
	}
	return nil
}

func checkWheel(data []byte, py string) error {
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return err
	}
	meta := "handoff-" + py + ".dist-info/METADATA"
	var license, typed bool
	var metadata []byte
	for _, f := range zr.File {
		switch {
		case f.Name == meta:
			rc, err := f.Open()
			if err != nil {
				return err
			}
			metadata, err = io.ReadAll(io.LimitReader(rc, maxMember))
			_ = rc.Close()
			if err != nil {
				return err
			}
		case strings.HasPrefix(f.Name, "handoff-"+py+".dist-info/") && strings.Contains(f.Name, "LICENSE"):
			license = true
		case f.Name == "handoff/py.typed":
			typed = true
		}
	}
	if metadata == nil {
		return fmt.Errorf("no %s", meta)
	}
	if !license || !typed {
		return fmt.Errorf("LICENSE in its dist-info %v, handoff/py.typed %v: want both", license, typed)
	}
	return checkPythonMetadata(metadata, py)
}

// checkPythonMetadata: core metadata (a wheel's METADATA, an sdist's
// PKG-INFO) of handoff at version py.
func checkPythonMetadata(meta []byte, py string) error {
	var name, version string
	for line := range strings.Lines(string(meta)) {
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break // the headers end; the description follows
		}
		if k, val, ok := strings.Cut(line, ": "); ok {
			switch k {
			case "Name":
				name = val
			case "Version":
				version = val
			}
		}
	}
	if name != "handoff" || version != py {
		return fmt.Errorf("metadata: Name %q, Version %q: want handoff at %s", name, version, py)
	}
	return nil
}

func checkNPM(file string, data []byte, npm string) error {
	files, err := untar(data, "package/package.json", "package/LICENSE")
	if err != nil {
		return err
	}
	var pkg struct {
		Name             string            `json:"name"`
		Version          string            `json:"version"`
		PeerDependencies map[string]string `json:"peerDependencies"`
	}
	if err := json.Unmarshal(files["package/package.json"], &pkg); err != nil {
		return err
	}
	want := "@handoff-dev/worker"
	if strings.HasPrefix(file, "handoff-dev-bullmq-") {
		want = "@handoff-dev/bullmq"
		if p := pkg.PeerDependencies["@handoff-dev/worker"]; p != "^"+npm {
			return fmt.Errorf("package.json: peerDependencies[@handoff-dev/worker] %q: want ^%s", p, npm)
		}
	}
	if pkg.Name != want || pkg.Version != npm {
		return fmt.Errorf("package.json: name %q, version %q: want %s at %s", pkg.Name, pkg.Version, want, npm)
	}
	return nil
}

// checkGem: a gem is a tar holding metadata.gz, its gemspec as YAML.
func checkGem(data []byte, gem string) error {
	files, err := untar(data, "metadata.gz", "data.tar.gz")
	if err != nil {
		return err
	}
	zr, err := gzip.NewReader(bytes.NewReader(files["metadata.gz"]))
	if err != nil {
		return fmt.Errorf("metadata.gz: %w", err)
	}
	meta, err := io.ReadAll(io.LimitReader(zr, maxMember))
	if err != nil {
		return fmt.Errorf("metadata.gz: %w", err)
	}
	name := regexp.MustCompile(`(?m)^name: (\S+)$`).FindSubmatch(meta)
	version := regexp.MustCompile(`(?m)^version: !ruby/object:Gem::Version\n\s+version: (\S+)$`).FindSubmatch(meta)
	if name == nil || version == nil || string(name[1]) != "handoff" || string(version[1]) != gem {
		return fmt.Errorf("metadata: want the gem handoff at %s:\n%s", gem, meta)
	}
	return nil
}

// checkSBOM: an SPDX JSON document that names version v: its name, or
// the version of the package it describes.
func checkSBOM(data []byte, v string) error {
	var doc struct {
		SPDXVersion string `json:"spdxVersion"`
		Name        string `json:"name"`
		Packages    []struct {
			Name        string `json:"name"`
			VersionInfo string `json:"versionInfo"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("not SPDX JSON: %w", err)
	}
	if !strings.HasPrefix(doc.SPDXVersion, "SPDX-") {
		return fmt.Errorf("spdxVersion %q: want an SPDX document", doc.SPDXVersion)
	}
	if strings.Contains(doc.Name, v) {
		return nil
	}
	for _, p := range doc.Packages {
		if p.VersionInfo == v {
			return nil
		}
	}
	return fmt.Errorf("names no %s: neither its name %q nor a package's versionInfo", v, doc.Name)
}

// untar reads a tar, gzipped or not, and returns the named members, each
// of which must be there.
func untar(data []byte, names ...string) (map[string][]byte, error) {
	var r io.Reader = bytes.NewReader(data)
	if len(data) > 2 && data[0] == 0x1f && data[1] == 0x8b {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, err
		}
		r = zr
	}
	tr := tar.NewReader(r)
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		n := strings.TrimPrefix(h.Name, "./")
		if slices.Contains(names, n) {
			if out[n], err = io.ReadAll(io.LimitReader(tr, maxMember)); err != nil {
				return nil, err
			}
		}
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("no %s inside", n)
		}
	}
	return out, nil
}

// writeList writes each asset's name, size in bytes and SHA-256.
func writeList(path string, assets []asset) error {
	var b strings.Builder
	for _, a := range assets {
		fmt.Fprintf(&b, "%s\t%d bytes\tsha256:%s\t%s\n", a.Name, a.Size, a.SHA256, a.Kind)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
