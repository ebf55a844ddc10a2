package docs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The repository is Apache-2.0, and everything that ships on its own says
// so: the copies of LICENSE that the charts and the SDK packages pack are
// the repository's byte for byte, and each package's metadata names the
// license. (The images' OCI label and the release archives are
// hack/release.sh's and hack/krew.sh's; TestReleaseSignaturesVerify
// and TestKrewInstallsTheKubectlPlugin check them in the e2e suite.)
func TestLicenseShipsWithEveryPackage(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	license := read("LICENSE")
	if !strings.Contains(license, "Apache License\n                           Version 2.0, January 2004") ||
		!strings.Contains(license, "END OF TERMS AND CONDITIONS") {
		t.Fatal("LICENSE is not the Apache License 2.0's canonical text")
	}
	for _, dir := range []string{"charts/handoff", "charts/handoff-workload", "sdk/python", "sdk/node", "sdk/node/bullmq"} {
		if read(filepath.Join(dir, "LICENSE")) != license {
			t.Errorf("%s/LICENSE differs from the repository's LICENSE: copy it again (cp LICENSE %s/)", dir, dir)
		}
	}
	for path, want := range map[string]string{
		"charts/handoff/Chart.yaml":          "artifacthub.io/license: Apache-2.0",
		"charts/handoff-workload/Chart.yaml": "artifacthub.io/license: Apache-2.0",
		"sdk/python/pyproject.toml":          `license = {text = "Apache-2.0"}`,
		"sdk/python/MANIFEST.in":             "LICENSE",
		"sdk/node/package.json":              `"license": "Apache-2.0"`,
		"sdk/node/bullmq/package.json":       `"license": "Apache-2.0"`,
		"hack/release.sh":                    "org.opencontainers.image.licenses=Apache-2.0",
	} {
		if !strings.Contains(read(path), want) {
			t.Errorf("%s does not say %s", path, want)
		}
	}
	for _, path := range []string{"sdk/node/package.json", "sdk/node/bullmq/package.json"} {
		if !strings.Contains(read(path), `"LICENSE"`) {
			t.Errorf("%s: its files do not list LICENSE", path)
		}
	}
}
