// Command image writes the handoff container image (or another static
// binary's) without a container engine: one layer holding the binary at
// --path (/handoff), and the sidecar's own build of it (--sidecar, at
// /handoff-sidecar, which injected pods run), on an empty base
// (no shell, no libc), run as the non-root user 65532, entrypoint
// --path. The result is a docker-archive tarball that `ctr images import`
// and `docker load` read. It prints the image's size.
//
// Usage: go run ./hack/image --binary bin/handoff --sidecar bin/handoff-sidecar --tag handoff:dev --out bin/handoff-image.tar
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

var (
	binary = flag.String("binary", "bin/handoff", "static handoff binary (make build)")
	tag    = flag.String("tag", "handoff:dev", "image reference recorded in the tarball")
	out    = flag.String("out", "bin/handoff-image.tar", "tarball to write")
	path   = flag.String("path", "/handoff", "where the binary goes in the image; also the entrypoint")
	side   = flag.String("sidecar", "", "static handoff binary built with -tags sidecaronly (make build), put at "+sidecarPath+"; empty for an image of another binary")
)

// sidecarPath is inject.SidecarBinary.
const sidecarPath = "/handoff-sidecar"

// nonroot is distroless's nonroot user and group.
const nonroot = 65532

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run() error {
	bin, err := os.ReadFile(*binary)
	if err != nil {
		return err
	}
	files := []file{{strings.TrimPrefix(*path, "/"), bin}}
	if *side != "" {
		sb, err := os.ReadFile(*side)
		if err != nil {
			return fmt.Errorf("--sidecar: %w", err)
		}
		files = append(files, file{strings.TrimPrefix(sidecarPath, "/"), sb})
	}
	ref, err := name.NewTag(*tag)
	if err != nil {
		return fmt.Errorf("--tag: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return rootfs(files) })
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	user := fmt.Sprintf("%d:%d", nonroot, nonroot)
	img, err = mutate.Config(img, v1.Config{Entrypoint: []string{*path}, User: user, WorkingDir: "/"})
	if err != nil {
		return err
	}
	img, err = mutate.ConfigFile(img, withPlatform(img))
	if err != nil {
		return err
	}
	if err := tarball.WriteToFile(*out, ref, img); err != nil {
		return err
	}
	compressed, err := layer.Size()
	if err != nil {
		return err
	}
	var size int
	for _, f := range files {
		size += len(f.data)
	}
	fmt.Printf("image %s: %s, layer %.1f MiB compressed, %.1f MiB uncompressed\n",
		ref, *out, float64(compressed)/(1<<20), float64(size)/(1<<20))
	return nil
}

func withPlatform(img v1.Image) *v1.ConfigFile {
	cf, err := img.ConfigFile()
	if err != nil {
		panic(err) // empty.Image's config is in memory
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: time.Unix(0, 0)} // reproducible
	return cf
}

// file is one executable of the image: its path without the leading
// slash, and its bytes.
type file struct {
	name string
	data []byte
}

// rootfs is the layer: the binaries, and an empty /tmp for a writable
// mount.
func rootfs(files []file) (io.ReadCloser, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: epoch}); err != nil {
		return nil, err
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o755, Size: int64(len(f.data)), ModTime: epoch, Uid: 0, Gid: 0}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return io.NopCloser(&buf), nil
}
