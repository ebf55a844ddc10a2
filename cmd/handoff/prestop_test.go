package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestPrestopFailsWhenSidecarUnreachable(t *testing.T) {
	cmd := prestopCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--addr", "127.0.0.1:1", "--connect-timeout", "100ms", "--token-file", tokenFile(t)})
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "not reachable") {
		t.Fatalf("prestop = %v, want an error saying the sidecar is not reachable", err)
	}
}

func TestSidecarRefusesBadConfiguration(t *testing.T) {
	cmd := sidecarCommand()
	cmd.SetArgs([]string{"--renew-deadline", "20s", "--fallback", "drop"})
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	err := cmd.Execute()
	for _, want := range []string{"renew-deadline", "flag --fallback", `"drop"`, "one of return, cancel, abandon"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("sidecar error %v does not say %q", err, want)
		}
	}
}
