// Package install is the install command: the init step that copies the
// handoff binary where the worker container can run its preStop hook, and
// writes the pod's token.
package install

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/protocol"
)

// defaultTokenMode is the token file's mode unless --token-mode says
// otherwise: readable by its owner and its group alone. The injector
// chooses the owner and the group so that the sidecar and the worker, and
// no other user, read it (inject.TokenFileAccess, docs/security.md).
const defaultTokenMode = 0o440

// Command is the install command.
var Command = command.Command{
	Use:   "install [DEST] [--token-file FILE]",
	Short: "Copy this binary to the file DEST and write the pod's token (the init step that gives the worker container its preStop hook)",
	Long: `install copies the running handoff binary to the file DEST with mode 0755,
and, with --token-file, writes the pod's token to FILE: 64 hex digits (256
bits from crypto/rand), mode --token-mode (0440: its owner, the user
install runs as, and its group), through a temporary file, so a reader
never sees half a token. A FILE that already holds a token is kept, so that a
rerun of the init step (a restart of the pod's sandbox) keeps the token the
sidecar and the worker read for the pod's whole life.

Injected pods run it in the handoff-install init container, so that the
worker container, whatever its image, can run "handoff prestop" from a shared
emptyDir volume, and only the pod's own sidecar, hook and worker know the
token the control API and the app require.`,
	MaxArgs: 1,
	Setup: func(fs *pflag.FlagSet) func(command.Invocation) error {
		var tokenFile, tokenMode string
		fs.StringVar(&tokenFile, "token-file", "", "write the pod's token to this file, unless it holds one already")
		fs.StringVar(&tokenMode, "token-mode", fmt.Sprintf("%04o", defaultTokenMode), "the token file's mode, in octal: 0400, 0440 or 0444 (who may read it; no one may write it)")
		return func(inv command.Invocation) error {
			args := inv.Args
			mode, err := strconv.ParseUint(tokenMode, 8, 32)
			if err != nil || (mode != 0o400 && mode != 0o440 && mode != 0o444) {
				return fmt.Errorf("--token-mode %q: want 0400, 0440 or 0444", tokenMode)
			}
			if len(args) == 0 && tokenFile == "" {
				return errors.New("nothing to install: give DEST, --token-file FILE, or both")
			}
			if len(args) == 1 {
				self, err := os.Executable()
				if err != nil {
					return err
				}
				if err := copyFile(self, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(inv.Out, "installed %s\n", args[0])
			}
			if tokenFile != "" {
				kept, err := writeToken(tokenFile, os.FileMode(mode))
				if err != nil {
					return fmt.Errorf("--token-file: %w", err)
				}
				if kept {
					fmt.Fprintf(inv.Out, "kept the token in %s\n", tokenFile)
				} else {
					fmt.Fprintf(inv.Out, "wrote a new token to %s\n", tokenFile)
				}
			}
			return nil
		}
	},
}

// writeToken writes a new random token to dst, unless dst already holds a
// token (protocol.ReadTokenFile): then it keeps it and returns true. The
// new file is linked into place, so that of two writers only one token
// wins, and every reader sees a whole one.
func writeToken(dst string, mode os.FileMode) (kept bool, err error) {
	if _, err := protocol.ReadTokenFile(dst); err == nil {
		return true, nil
	} else if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, protocol.ErrNoToken) {
		return false, err
	}
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".token-*")
	if err != nil {
		return false, err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.WriteString(hex.EncodeToString(b[:]) + "\n"); err != nil {
		_ = tmp.Close()
		return false, err
	}
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return false, err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	err = os.Link(tmp.Name(), dst)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, fs.ErrExist):
		// Another writer won, or dst holds no token (empty, cut short):
		// keep a token, replace anything else.
		if _, rerr := protocol.ReadTokenFile(dst); rerr == nil {
			return true, nil
		}
		return false, os.Rename(tmp.Name(), dst)
	}
	return false, err
}

// copyFile writes src to dst through a temporary file in dst's directory,
// so a reader never sees a half-written binary.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".handoff-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := io.Copy(tmp, in); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
