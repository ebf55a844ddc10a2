// Package modgraph_test checks that the Go SDK costs nothing to import: the
// modules an app requires to use package worker or one of its queue
// adapters hold none of the sidecar's dependencies, and an app pinned to
// older versions of client-go and a queue client keeps them, and its go
// line, when it adds the SDK. It runs the go command on the repository's
// modules outside the workspace (GOWORK=off), as an app's build sees them,
// with modules from the module proxy (GOPROXY) or the module cache.
package modgraph_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

const repo = "github.com/handoff-dev/handoff"

// modules are the repository's library modules, by directory (go.work
// lists them with the root module).
var modules = []string{"protocol", "worker", "worker/jetstream", "worker/rabbitmq", "worker/redisstreams", "worker/river"}

// root is the repository's root directory.
func root(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// goCmd runs the go command in dir outside the workspace and returns its
// output; it fails the test on an error. With modfile set, the go command
// reads that copy of dir's go.mod, and writes the checksums it adds to the
// copy's go.sum beside it (-modfile), leaving dir's files as they are.
func goCmd(t *testing.T, dir, modfile string, args ...string) string {
	t.Helper()
	flags := "GOFLAGS=-mod=mod"
	if modfile != "" {
		flags += " -modfile=" + modfile
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", flags)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// heavy are the modules an app must not get from the SDK: the sidecar's
// Kubernetes clients and controller framework, its metrics and logging.
var heavy = []string{
	"k8s.io/client-go", "k8s.io/api", "k8s.io/apimachinery", "sigs.k8s.io/controller-runtime",
	"github.com/prometheus/client_golang", "github.com/spf13/cobra", "go.uber.org/zap",
	"github.com/open-policy-agent/cert-controller", "github.com/google/go-containerregistry",
}

// queueClients are the queue clients, each allowed only in its adapter's
// graph.
var queueClients = map[string]string{
	"jetstream": "github.com/nats-io/nats.go", "rabbitmq": "github.com/rabbitmq/amqp091-go",
	"redisstreams": "github.com/redis/go-redis/v9", "river": "github.com/riverqueue/river",
}

// Each library module's graph (go list -m all, every module its go.mod
// files reach, the test-only ones among them) holds none of the sidecar's
// dependencies, and no queue client but its own adapter's.
func TestLibraryModulesLeaveTheSidecarsDependenciesOut(t *testing.T) {
	for _, dir := range modules {
		t.Run(dir, func(t *testing.T) {
			// Copies of go.mod and go.sum: go list adds the checksums of the
			// go.mod files it reads to go.sum, which go mod tidy leaves out.
			mod, tmp := filepath.Join(root(t), dir), t.TempDir()
			for _, name := range []string{"go.mod", "go.sum"} {
				data, err := os.ReadFile(filepath.Join(mod, name))
				if err != nil && !os.IsNotExist(err) {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(tmp, name), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			// The copy replaces the repository's other modules with their
			// directories, as go.work does (the go.mod files require them at
			// the last release's version).
			var reps []string
			for _, other := range modules {
				if other != dir {
					reps = append(reps, "-replace="+repo+"/"+other+"="+filepath.Join(root(t), other))
				}
			}
			goCmd(t, mod, "", append([]string{"mod", "edit"}, append(reps, filepath.Join(tmp, "go.mod"))...)...)
			all := strings.Fields(goCmd(t, mod, filepath.Join(tmp, "go.mod"), "list", "-m", "-f", "{{.Path}}", "all"))
			for _, m := range all {
				if slices.Contains(heavy, m) {
					t.Errorf("module %s/%s requires %s (go list -m all)", repo, dir, m)
				}
				if m == repo {
					t.Errorf("module %s/%s requires the sidecar's module %s", repo, dir, repo)
				}
				for adapter, client := range queueClients {
					if m == client && dir != "worker/"+adapter {
						t.Errorf("module %s/%s requires %s, the queue client of worker/%s", repo, dir, m, adapter)
					}
				}
			}
			if dir == "protocol" && len(all) != 1 {
				t.Errorf("module %s/protocol requires %v; want nothing outside the standard library", repo, all[1:])
			}
		})
	}
}

// An app pinned to client-go v0.33.4 and go-redis v9.7.3, with go 1.24.0
// (client-go v0.33.4's own go line), adds package worker and the Redis Streams adapter: go mod tidy moves
// neither, nor the go line, and the app builds.
func TestAnAppPinnedToOlderClientsKeepsThemWithTheSDK(t *testing.T) {
	app := t.TempDir() // outside the repository: no go.work applies
	r := root(t)
	gomod := `module example.com/app

go 1.24.0

require (
	k8s.io/client-go v0.33.4
	github.com/redis/go-redis/v9 v9.7.3
	` + repo + `/worker v0.0.0-00010101000000-000000000000
	` + repo + `/worker/redisstreams v0.0.0-00010101000000-000000000000
)

replace (
	` + repo + `/protocol => ` + filepath.Join(r, "protocol") + `
	` + repo + `/worker => ` + filepath.Join(r, "worker") + `
	` + repo + `/worker/redisstreams => ` + filepath.Join(r, "worker", "redisstreams") + `
)
`
	main := `package main

import (
	"github.com/redis/go-redis/v9"
	"k8s.io/client-go/rest"

	"` + repo + `/worker"
	"` + repo + `/worker/redisstreams"
)

func main() {
	_ = rest.Config{}
	_ = redis.NewClient(&redis.Options{})
	_ = worker.Options{}
	_ = redisstreams.Config{}
}
`
	for name, body := range map[string]string{"go.mod": gomod, "main.go": main} {
		if err := os.WriteFile(filepath.Join(app, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goCmd(t, app, "", "mod", "tidy")
	data, err := os.ReadFile(filepath.Join(app, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.Go == nil || f.Go.Version != "1.24.0" || f.Toolchain != nil {
		t.Errorf("go mod tidy changed the app's go line (toolchain line %v), want go 1.24.0 still:\n%s", f.Toolchain, data)
	}
	want := map[string]string{"k8s.io/client-go": "v0.33.4", "github.com/redis/go-redis/v9": "v9.7.3"}
	for _, req := range f.Require {
		if v, ok := want[req.Mod.Path]; ok && req.Mod.Version != v {
			t.Errorf("go mod tidy moved %s from %s to %s:\n%s", req.Mod.Path, v, req.Mod.Version, data)
		}
		if req.Mod.Path == "sigs.k8s.io/controller-runtime" || req.Mod.Path == "github.com/prometheus/client_golang" {
			t.Errorf("the app requires %s since it added the SDK:\n%s", req.Mod.Path, data)
		}
	}
	goCmd(t, app, "", "build", "-o", os.DevNull, ".")
}
