package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

func installCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "install DEST",
		Short: "Copy this binary to the file DEST (the init step that gives the worker container its preStop hook)",
		Long: `install copies the running handoff binary to the file DEST with mode 0755. Injected
pods run it in the handoff-install init container, so that the worker
container, whatever its image, can run "handoff prestop" from a shared
emptyDir volume.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			self, err := os.Executable()
			if err != nil {
				return err
			}
			if err := copyFile(self, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "installed %s\n", args[0])
			return nil
		},
	}
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
