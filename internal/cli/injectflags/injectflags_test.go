package injectflags

import (
	"strings"
	"testing"

	"github.com/handoff-dev/handoff/version"
)

// The injector's default image is the sidecar image of this build's
// version, and a development build's --image help says that no registry
// has it.
func TestDefaultImageIsThisVersionsSidecar(t *testing.T) {
	if got, want := DefaultImage(), "ghcr.io/handoff-dev/handoff-sidecar:"+version.Get(); got != want {
		t.Errorf("default image %s, want %s", got, want)
	}
	if v := version.Get(); !version.Released(v) && !strings.Contains(ImageUsage(), v+" is a development build") {
		t.Errorf("--image help of the development build %s: %q; want it to say so", v, ImageUsage())
	}
}
