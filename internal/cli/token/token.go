// Package token reads the pod's token for the commands that sign their
// calls with it (prestop, conformance).
package token

import (
	"fmt"
	"os"

	"github.com/handoff-dev/handoff/protocol"
)

// Read reads the pod's token from file, or from the file named by
// HANDOFF_TOKEN_FILE when file is "". Its errors: neither is set, or
// protocol.ReadTokenFile's.
func Read(file string) (string, error) {
	if file == "" {
		file = os.Getenv(protocol.TokenFileEnv)
	}
	if file == "" {
		return "", fmt.Errorf("no token file: the sidecar needs the pod's token; give --token-file (injected pods use %s) or set %s", protocol.TokenFile, protocol.TokenFileEnv)
	}
	return protocol.ReadTokenFile(file)
}
