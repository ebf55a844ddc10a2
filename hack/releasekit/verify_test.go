package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

const testVersion = "v1.2.3-rc.4"

// tarball packs files (name: contents) as a tar, gzipped if gz.
func tarball(t *testing.T, gz bool, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w = &buf
	var zw *gzip.Writer
	tw := tar.NewWriter(w)
	if gz {
		zw = gzip.NewWriter(w)
		tw = tar.NewWriter(zw)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n]))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(files[n]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func gzipped(t *testing.T, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zipped(t *testing.T, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for n, data := range files {
		f, err := zw.Create(n)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sbomOf(name, v string) []byte {
	return fmt.Appendf(nil, `{"spdxVersion": "SPDX-2.3", "name": %q, "packages": [{"name": %q, "versionInfo": %q}]}`, name, name, v)
}

// fakeRelease returns the assets of a release at testVersion as
// hack/release.sh lays them out, binaries aside (verify reads a binary's
// Go build information: the snapshot test has real ones).
func fakeRelease(t *testing.T) map[string][]byte {
	t.Helper()
	reg, err := registryVersions(testVersion)
	if err != nil {
		t.Fatal(err)
	}
	py, npm, gem := reg.Python, reg.NPM, reg.Gem
	pyMeta := []byte("Metadata-Version: 2.1\nName: handoff\nVersion: " + py + "\nSummary: x\n\nVersion: 9.9.9 in the description\n")
	gemMeta := "--- !ruby/object:Gem::Specification\nname: handoff\nversion: !ruby/object:Gem::Version\n  version: " + gem + "\nplatform: ruby\n"
	a := map[string][]byte{
		"LICENSE": []byte("                                 Apache License\n"),
		"handoff.yaml": []byte("apiVersion: krew.googlecontainertools.github.com/v1alpha2\nkind: Plugin\nmetadata:\n  name: handoff\nspec:\n  version: " +
			testVersion + "\n"),
		"handoff-" + testVersion + ".tgz": tarball(t, true, map[string][]byte{
			"handoff/Chart.yaml": []byte("apiVersion: v2\nname: handoff\nversion: " + testVersion + "\nappVersion: " + testVersion + "\n")}),
		"handoff-workload-" + testVersion + ".tgz": tarball(t, true, map[string][]byte{
			"handoff-workload/Chart.yaml": []byte("apiVersion: v2\nname: handoff-workload\nversion: " + testVersion + "\nappVersion: " + testVersion + "\n")}),
		"handoff-" + py + "-py3-none-any.whl": zipped(t, map[string][]byte{
			"handoff/__init__.py": nil, "handoff/py.typed": nil,
			"handoff-" + py + ".dist-info/METADATA": pyMeta, "handoff-" + py + ".dist-info/LICENSE": []byte("Apache")}),
		"handoff-" + py + ".tar.gz": tarball(t, true, map[string][]byte{"handoff-" + py + "/PKG-INFO": pyMeta}),
		"handoff-dev-worker-" + npm + ".tgz": tarball(t, true, map[string][]byte{
			"package/package.json": []byte(`{"name": "@handoff-dev/worker", "version": "` + npm + `"}`), "package/LICENSE": nil}),
		"handoff-dev-bullmq-" + npm + ".tgz": tarball(t, true, map[string][]byte{
			"package/package.json": []byte(`{"name": "@handoff-dev/bullmq", "version": "` + npm + `", "peerDependencies": {"@handoff-dev/worker": "^` + npm + `"}}`),
			"package/LICENSE":      nil}),
		"handoff-" + gem + ".gem": tarball(t, false, map[string][]byte{
			"metadata.gz": gzipped(t, []byte(gemMeta)), "data.tar.gz": gzipped(t, nil)}),
	}
	for _, n := range []string{"handoff-" + py + "-py3-none-any.whl", "handoff-" + py + ".tar.gz", "handoff-dev-worker-" + npm + ".tgz", "handoff-dev-bullmq-" + npm + ".tgz", "handoff-" + gem + ".gem"} {
		a[n+".spdx.json"] = sbomOf(n, testVersion)
	}
	return a
}

// writeRelease writes the assets into a new directory with their
// checksums.txt (sha256sum's format), less the names in unlisted.
func writeRelease(t *testing.T, assets map[string][]byte, unlisted ...string) string {
	t.Helper()
	dir := t.TempDir()
	var sums strings.Builder
	names := make([]string, 0, len(assets))
	for n := range assets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), assets[n], 0o644); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(unlisted, n) {
			continue
		}
		s := sha256.Sum256(assets[n])
		fmt.Fprintf(&sums, "%s  %s\n", hex.EncodeToString(s[:]), n)
	}
	if err := os.WriteFile(filepath.Join(dir, checksumsName), []byte(sums.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestVerify(t *testing.T) {
	assets := fakeRelease(t)
	got, err := verify(writeRelease(t, assets), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(assets)+1 {
		t.Errorf("%d assets, want %d and checksums.txt", len(got), len(assets))
	}
	for _, a := range got {
		if a.Kind == "" || a.Size == 0 && a.Name != checksumsName || len(a.SHA256) != 64 {
			t.Errorf("asset %+v: want a kind, a size and a SHA-256", a)
		}
	}
	// No SBOM at all is a release without the sbom step.
	for n := range assets {
		if strings.HasSuffix(n, ".spdx.json") {
			delete(assets, n)
		}
	}
	if _, err := verify(writeRelease(t, assets), testVersion); err != nil {
		t.Errorf("without SBOMs: %v", err)
	}
}

func TestVerifyRefuses(t *testing.T) {
	reg, _ := registryVersions(testVersion)
	self, err := os.Executable() // a Go binary without the release's -ldflags
	if err != nil {
		t.Fatal(err)
	}
	selfData, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	worker := "handoff-dev-worker-" + reg.NPM + ".tgz"
	bullmq := "handoff-dev-bullmq-" + reg.NPM + ".tgz"
	gem := "handoff-" + reg.Gem + ".gem"
	wheel := "handoff-" + reg.Python + "-py3-none-any.whl"
	for _, c := range []struct {
		name   string
		change func(t *testing.T, a map[string][]byte) (unlisted []string)
		want   string
	}{
		{"a file not in checksums.txt", func(_ *testing.T, _ map[string][]byte) []string { return []string{"LICENSE"} }, "LICENSE: not in checksums.txt"},
		{"a file of no kind the release makes", func(_ *testing.T, a map[string][]byte) []string {
			a["handoff.yaml.orig"] = []byte("x")
			return nil
		}, "handoff.yaml.orig: not an asset of release"},
		{"an npm package at another version", func(t *testing.T, a map[string][]byte) []string {
			a[worker] = tarball(t, true, map[string][]byte{"package/package.json": []byte(`{"name": "@handoff-dev/worker", "version": "0.1.0"}`), "package/LICENSE": nil})
			return nil
		}, `version "0.1.0": want @handoff-dev/worker at ` + reg.NPM},
		{"bullmq's peer dependency at another version", func(t *testing.T, a map[string][]byte) []string {
			a[bullmq] = tarball(t, true, map[string][]byte{
				"package/package.json": []byte(`{"name": "@handoff-dev/bullmq", "version": "` + reg.NPM + `", "peerDependencies": {"@handoff-dev/worker": "^0.1.0"}}`),
				"package/LICENSE":      nil})
			return nil
		}, "peerDependencies[@handoff-dev/worker]"},
		{"an npm package under the old scope", func(t *testing.T, a map[string][]byte) []string {
			a[worker] = tarball(t, true, map[string][]byte{"package/package.json": []byte(`{"name": "@handoff/worker", "version": "` + reg.NPM + `"}`), "package/LICENSE": nil})
			return nil
		}, `name "@handoff/worker"`},
		{"a gem at another version", func(t *testing.T, a map[string][]byte) []string {
			a[gem] = tarball(t, false, map[string][]byte{"data.tar.gz": nil, "metadata.gz": gzipped(t, []byte("name: handoff\nversion: !ruby/object:Gem::Version\n  version: 0.0.0\n"))})
			return nil
		}, "want the gem handoff at " + reg.Gem},
		{"a wheel without its LICENSE", func(t *testing.T, a map[string][]byte) []string {
			a[wheel] = zipped(t, map[string][]byte{"handoff/py.typed": nil, "handoff-" + reg.Python + ".dist-info/METADATA": []byte("Name: handoff\nVersion: " + reg.Python + "\n")})
			return nil
		}, "LICENSE in its dist-info false"},
		{"a chart at another version", func(t *testing.T, a map[string][]byte) []string {
			a["handoff-"+testVersion+".tgz"] = tarball(t, true, map[string][]byte{"handoff/Chart.yaml": []byte("name: handoff\nversion: " + testVersion + "\nappVersion: v0.0.0-dev\n")})
			return nil
		}, `appVersion "v0.0.0-dev"`},
		{"a package without an SBOM where the others have one", func(_ *testing.T, a map[string][]byte) []string {
			delete(a, gem+".spdx.json")
			return nil
		}, gem + ": no SBOM"},
		{"an SBOM that does not name the version", func(_ *testing.T, a map[string][]byte) []string {
			a[gem+".spdx.json"] = sbomOf(gem, "v0.0.0")
			return nil
		}, "names no " + testVersion},
		{"an SBOM of nothing released", func(_ *testing.T, a map[string][]byte) []string {
			a["handoff-linux-riscv64.spdx.json"] = sbomOf("x", testVersion)
			return nil
		}, "an SBOM of no binary or SDK package"},
		{"a binary without the release's version", func(_ *testing.T, a map[string][]byte) []string {
			a["handoff-linux-amd64"] = selfData
			a["handoff-linux-amd64.spdx.json"] = sbomOf("handoff-linux-amd64", testVersion)
			return nil
		}, "handoff-linux-amd64: the build of github.com/handoff-dev/handoff/hack/releasekit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := fakeRelease(t)
			dir := writeRelease(t, a, c.change(t, a)...)
			_, err := verify(dir, testVersion)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v\nwant one saying %q", err, c.want)
			}
		})
	}
}

// TestVerifyRefusesChangedAndMissingFiles: checksums.txt made, then a
// file changed, and another removed.
func TestVerifyRefusesChangedAndMissingFiles(t *testing.T) {
	a := fakeRelease(t)
	dir := writeRelease(t, a)
	if err := os.WriteFile(filepath.Join(dir, "LICENSE"), append(a["LICENSE"], '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "handoff.yaml")); err != nil {
		t.Fatal(err)
	}
	_, err := verify(dir, testVersion)
	for _, want := range []string{"LICENSE: SHA-256 ", "checksums.txt names handoff.yaml, which is not in"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\nwant one saying %q", err, want)
		}
	}
}
