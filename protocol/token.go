package protocol

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// The pod's token: a secret that only the pod's own handoff sidecar, preStop
// hook and worker can read, the key that signs every call between them
// (Sign, Verifier), so that nothing else, even a process that reads the
// calls off the wire, can start the shutdown sequence or tell the worker
// about leadership. It is never sent. docs/protocol.md, "The pod's token".
const (
	// TokenFileEnv names the environment variable that holds the path of
	// the token file. The injector sets it in the sidecar and the worker
	// container; `handoff prestop`, the sidecar and package worker read it.
	TokenFileEnv = "HANDOFF_TOKEN_FILE"
	// TokenFile is where the injected pod keeps its token: written by the
	// handoff-install init container into the handoff-bin emptyDir, mounted
	// read-only into the sidecar and the worker container.
	TokenFile = "/handoff-bin/token"
	// MinTokenLength is the shortest token a reader accepts, in bytes; the
	// install step writes 64 hex digits (256 random bits).
	MinTokenLength = 32
)

// ErrNoToken is returned by ReadTokenFile for a file that holds no usable
// token.
var ErrNoToken = errors.New("no usable token")

// ReadTokenFile reads the token from the file at path: its content with
// surrounding white space removed, which must be at least MinTokenLength
// printable ASCII characters (no space). The error names the file and, for
// a bad content, wraps ErrNoToken.
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	tok := strings.TrimSpace(string(b))
	if err := CheckToken(tok); err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	return tok, nil
}

// CheckToken says whether tok can be a token: at least MinTokenLength
// printable ASCII characters, none of them a space. The error wraps
// ErrNoToken.
func CheckToken(tok string) error {
	if len(tok) < MinTokenLength {
		return fmt.Errorf("%w: %d bytes; want at least %d printable ASCII characters (handoff install writes 64 hex digits)", ErrNoToken, len(tok), MinTokenLength)
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%w: byte %d is not printable ASCII; want printable ASCII characters and no space", ErrNoToken, i)
		}
	}
	return nil
}

// Bounds of a Leadership message the app accepts: a message beyond them
// cannot come from the sidecar, and the app answers it 422 without
// applying it (package worker; docs/protocol.md).
const (
	// MaxLeaseDuration is the longest lease duration the sidecar accepts
	// (its lease-duration setting), and so a bound on any term it grants:
	// a term is shorter than the lease duration.
	MaxLeaseDuration = time.Hour
	// LeaseDurationEnv names the environment variable with the sidecar's
	// lease duration (a Go duration, like 15s), which the injector also sets
	// in the worker container: the app then refuses a grant valid for
	// longer than that, rather than MaxLeaseDuration.
	LeaseDurationEnv = "HANDOFF_LEASE_DURATION"
	// ShardsEnv names the environment variable with the pod's shard set
	// (its handoff.dev/shards, expanded: the Lease names, comma-separated),
	// which the injector sets in the worker container when there is one;
	// worker.ShardsFromEnv reads it.
	ShardsEnv = "HANDOFF_SHARDS"
	// MaxSequenceAhead is how far a Leadership sequence may be ahead of the
	// app's own clock (Unix nanoseconds). The sidecar's sequence is its send
	// time on the same node's clock, so a genuine one is never ahead by
	// more than the moment the message takes, unless the clock was set back
	// by more than this while both ran: then the app refuses the grants
	// (leadership runs out early, never late) until the clock catches up.
	// Small, so that no message, even a genuine one sent early, raises the
	// floor under which later messages are stale by more than this.
	MaxSequenceAhead = time.Second
)
