//go:build e2e

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReleaseSignaturesVerify: the images and the chart the suite
// installed, which hack/release.sh signed with cosign, verify with the
// release's public key in the registry they were pulled from; an unsigned
// image, a tampered copy of a signed one (one label added: another
// digest) and a signed image checked against another key are refused.
// The images carry the OCI labels, run as user 65532 from ko's
// /ko-app/handoff (handoff-sidecar: /ko-app/handoff-sidecar), and have ko's SPDX SBOM attached.
func TestReleaseSignaturesVerify(t *testing.T) {
	tools, err := exec.Command("bash", "../hack/tools.sh").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := strings.TrimSpace(string(tools))
	var plain []string
	if plainHTTP(strings.TrimPrefix(images.release.record["CHART"], "oci://")) {
		plain = []string{"--allow-http-registry"}
	}
	run := func(name string, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		return strings.TrimSpace(string(out) + "\n" + stderr.String()), err
	}
	// stdout runs a command for its answer on stdout alone.
	stdout := func(name string, args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(bin, name), args...).Output()
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return strings.TrimSpace(string(out)), err
	}
	verify := func(pub, ref string) (string, error) {
		return run("cosign", append([]string{"verify", "--key", pub, "--insecure-ignore-tlog=true"}, append(plain, ref)...)...)
	}
	chart := strings.TrimPrefix(images.release.record["CHART"], "oci://") + "@" + images.release.record["CHART_DIGEST"]
	for _, ref := range []string{images.release.handoff, images.release.sidecar, chart} {
		if out, err := verify(images.release.cosignPub, ref); err != nil {
			t.Errorf("cosign verify %s with the release's key: %v\n%s", ref, err, out)
		}
	}

	// Unsigned: the example worker, built by ko on the same base.
	if out, err := verify(images.release.cosignPub, images.pgworker); err == nil {
		t.Errorf("cosign verify of the unsigned image %s passed:\n%s", images.pgworker, out)
	}
	// Tampered: the sidecar's image with one more label, pushed beside it.
	repo, _, _ := strings.Cut(images.release.sidecar, "@")
	tampered, err := stdout("crane", "mutate", images.release.sidecar, "--label", "tampered=true", "-t", repo+":tampered")
	if err != nil {
		t.Fatalf("crane mutate: %v\n%s", err, tampered)
	}
	if tampered == images.release.sidecar || !strings.Contains(tampered, "@sha256:") {
		t.Fatalf("crane mutate printed %q, want a new reference by digest", tampered)
	}
	if out, err := verify(images.release.cosignPub, tampered); err == nil {
		t.Errorf("cosign verify of the tampered image %s passed:\n%s", tampered, out)
	}
	// Another key: a key pair made here.
	other := filepath.Join(t.TempDir(), "other")
	if out, err := run("cosign", "generate-key-pair", "--output-key-prefix", other); err != nil {
		t.Fatalf("cosign generate-key-pair: %v\n%s", err, out)
	}
	if out, err := verify(other+".pub", images.release.handoff); err == nil {
		t.Errorf("cosign verify of %s with another key passed:\n%s", images.release.handoff, out)
	}

	// Labels, user, entrypoint; the SBOM ko attached (cosign's tag scheme:
	// sha256-<hex>.sbom).
	// ko names each image's binary after its main package's folder.
	for ref, entrypoint := range map[string]string{images.release.handoff: "/ko-app/handoff", images.release.sidecar: "/ko-app/handoff-sidecar"} {
		out, err := stdout("crane", "config", ref)
		if err != nil {
			t.Fatalf("crane config %s: %v\n%s", ref, err, out)
		}
		var cfg struct {
			Config struct {
				User       string
				Entrypoint []string
				Labels     map[string]string
			} `json:"config"`
		}
		if err := json.Unmarshal([]byte(out), &cfg); err != nil {
			t.Fatalf("crane config %s: %v\n%s", ref, err, out)
		}
		c := cfg.Config
		if c.User != "65532:65532" || len(c.Entrypoint) != 1 || c.Entrypoint[0] != entrypoint ||
			c.Labels["org.opencontainers.image.version"] != releaseVersion || c.Labels["org.opencontainers.image.source"] == "" ||
			c.Labels["org.opencontainers.image.revision"] == "" || c.Labels["org.opencontainers.image.licenses"] != "Apache-2.0" {
			t.Errorf("%s: config %+v, want user 65532:65532, entrypoint %s, OCI labels version %s, source, revision and licenses Apache-2.0", ref, c, entrypoint, releaseVersion)
		}
		repo, digest, _ := strings.Cut(ref, "@sha256:")
		if out, err := stdout("crane", "manifest", repo+":sha256-"+digest+".sbom"); err != nil {
			t.Errorf("%s: no SBOM attached: %v\n%s", ref, err, out)
		}
	}
}
