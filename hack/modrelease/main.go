// Command modrelease keeps the repository's Go modules (the ones go.work
// uses: the sidecar's module at the root, protocol, worker and each queue
// adapter) requiring each other at one version, with no replace directive
// in any go.mod, and serves them as a module proxy would.
//
// Every go.mod requires the repository's other modules at the same version:
// the last release's (v0.0.0-00010101000000-000000000000 before the first
// release, a version no proxy serves). go.work replaces exactly that
// version of each with its directory, so inside the repository every build
// and test uses the local trees; outside it (GOWORK=off, go install ...@vX)
// the go command resolves the tags.
//
// Usage (from the repository's root, as hack/release-modules.sh and
// hack/modules.sh run it):
//
//	go run ./hack/modrelease require VERSION
//	    Sets every requirement of one of the repository's modules on another
//	    to VERSION, in the order they require each other (protocol first,
//	    the root module last), with the go.sum lines of each such
//	    requirement (h1: hashes of the module's zip and of its go.mod, as
//	    the module proxy will serve them from the tags), computed from the
//	    working tree's files that git tracks or does not ignore; and moves
//	    go.work's replace directives to VERSION. It changes go.mod, go.sum
//	    and go.work files only; hack/release-modules.sh commits and tags.
//	go run ./hack/modrelease check
//	    Fails, naming the file and what to change, unless no go.mod has a
//	    replace directive, every requirement on one of the repository's
//	    modules names one version, and go.work replaces that version of each
//	    module (and nothing else) with its directory.
//	go run ./hack/modrelease tagged VERSION
//	    Fails unless every module has its tag for VERSION (below), all on
//	    the commit the tag VERSION is on, and the files there pass check
//	    with the modules requiring each other at VERSION: what the release
//	    workflow checks before it publishes anything.
//	go run ./hack/modrelease proxy -out DIR [-repo REPO] VERSION
//	    Writes a module proxy's files (GOPROXY=file://DIR) for each module
//	    at VERSION, made from its tag in the git repository REPO (default
//	    .): the tag is VERSION for the root module and DIR/VERSION for the
//	    module in DIR (worker/v0.2.0), as the go command looks them up. Each
//	    module gets @v/list (VERSION added to what is there), VERSION.info
//	    (the tagged commit's time), VERSION.mod and VERSION.zip (as
//	    golang.org/x/mod/zip makes it from git archive, what the go command
//	    does with a tag).
//
// VERSION is a semantic version with a leading v and no build metadata
// (v0.2.0, v0.2.0-rc.1).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// unreleased is the version the modules require each other at before the
// first release.
const unreleased = "v0.0.0-00010101000000-000000000000"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "require":
		if len(args) != 1 {
			usage()
		}
		err = require(".", args[0])
	case "check":
		if len(args) != 0 {
			usage()
		}
		err = check(".")
	case "tagged":
		if len(args) != 1 {
			usage()
		}
		err = tagged(".", args[0])
	case "proxy":
		fl := flag.NewFlagSet("proxy", flag.ExitOnError)
		out := fl.String("out", "", "the proxy's directory (GOPROXY=file://DIR), made if missing")
		repo := fl.String("repo", ".", "the git repository whose tags are served")
		_ = fl.Parse(args)
		if *out == "" || fl.NArg() != 1 {
			usage()
		}
		err = proxy(*repo, *out, fl.Arg(0))
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "modrelease:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: go run ./hack/modrelease require VERSION | check | tagged VERSION | proxy -out DIR [-repo REPO] VERSION")
	os.Exit(2)
}

// mod is one of the workspace's modules.
type mod struct {
	dir  string // relative to the repository's root, slash-separated, "." for the root
	path string // module path
	file *modfile.File
}

// workspace reads go.work in root and the go.mod of each module it uses.
func workspace(root string) (*modfile.WorkFile, []*mod, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, nil, err
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, nil, err
	}
	var mods []*mod
	for _, u := range wf.Use {
		dir := path.Clean(u.Path)
		name := filepath.Join(root, filepath.FromSlash(dir), "go.mod")
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, nil, err
		}
		f, err := modfile.Parse(name, data, nil)
		if err != nil {
			return nil, nil, err
		}
		if f.Module == nil {
			return nil, nil, fmt.Errorf("%s: no module line", name)
		}
		mods = append(mods, &mod{dir: dir, path: f.Module.Mod.Path, file: f})
	}
	return wf, mods, nil
}

// ordered returns mods with each after the ones it requires.
func ordered(mods []*mod) ([]*mod, error) {
	byPath := map[string]*mod{}
	for _, m := range mods {
		byPath[m.path] = m
	}
	var out []*mod
	done := map[string]bool{}
	for len(out) < len(mods) {
		progress := false
		for _, m := range mods {
			if done[m.path] {
				continue
			}
			ready := true
			for _, r := range m.file.Require {
				if byPath[r.Mod.Path] != nil && !done[r.Mod.Path] {
					ready = false
				}
			}
			if ready {
				out, done[m.path], progress = append(out, m), true, true
			}
		}
		if !progress {
			return nil, errors.New("the modules require each other in a cycle")
		}
	}
	return out, nil
}

func checkVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "" {
		return fmt.Errorf("version %q: want a semantic version with a leading v, all three numbers and no build metadata, like v0.2.0 or v0.2.0-rc.1", v)
	}
	return nil
}

// require sets every requirement among the workspace's modules to version.
func require(root, version string) error {
	if err := checkVersion(version); err != nil {
		return err
	}
	wf, mods, err := workspace(root)
	if err != nil {
		return err
	}
	mods, err = ordered(mods)
	if err != nil {
		return err
	}
	own := map[string]*mod{}
	for _, m := range mods {
		own[m.path] = m
	}
	// The go.sum lines of each module at version, once its files are final.
	sums := map[string][]string{}
	for _, m := range mods {
		var lines []string
		for _, r := range m.file.Require {
			if own[r.Mod.Path] == nil {
				continue
			}
			if err := m.file.AddRequire(r.Mod.Path, version); err != nil {
				return err
			}
			lines = append(lines, sums[r.Mod.Path]...)
		}
		for _, r := range slices.Clone(m.file.Replace) {
			if own[r.Old.Path] != nil {
				if err := m.file.DropReplace(r.Old.Path, r.Old.Version); err != nil {
					return err
				}
			}
		}
		m.file.Cleanup()
		data := modfile.Format(m.file.Syntax)
		dir := filepath.Join(root, filepath.FromSlash(m.dir))
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), data, 0o644); err != nil {
			return err
		}
		if err := writeSums(filepath.Join(dir, "go.sum"), own, lines); err != nil {
			return err
		}
		if sums[m.path], err = worktreeSums(root, m, version, data); err != nil {
			return err
		}
	}
	for _, m := range mods {
		moved := m.dir == "." // the root module is required by none
		for _, r := range slices.Clone(wf.Replace) {
			if r.Old.Path != m.path {
				continue
			}
			// The line moved to version in place, keeping its block and
			// comments; any other replacement of the module dropped.
			if tok := r.Syntax.Token; !moved && r.Old.Version != "" && path.Clean(r.New.Path) == m.dir {
				if i := slices.Index(tok, m.path); i >= 0 && i+1 < len(tok) && tok[i+1] == r.Old.Version {
					tok[i+1], r.Old.Version, moved = version, version, true
					continue
				}
			}
			if err := wf.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return err
			}
		}
		if !moved {
			if err := wf.AddReplace(m.path, version, "./"+m.dir, ""); err != nil {
				return err
			}
		}
	}
	wf.Cleanup()
	return os.WriteFile(filepath.Join(root, "go.work"), modfile.Format(wf.Syntax), 0o644)
}

// writeSums rewrites the go.sum file name with its lines on the modules in
// own replaced by add, sorted as the go command sorts them.
func writeSums(name string, own map[string]*mod, add []string) error {
	data, err := os.ReadFile(name)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) == 3 && own[f[0]] == nil {
			lines = append(lines, l)
		}
	}
	lines = append(lines, add...)
	if len(lines) == 0 {
		return nil
	}
	vers := func(l string) module.Version {
		f := strings.Fields(l)
		return module.Version{Path: f[0], Version: f[1]}
	}
	sort.SliceStable(lines, func(i, j int) bool {
		a, b := vers(lines[i]), vers(lines[j])
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		return versionLess(a.Version, b.Version)
	})
	return os.WriteFile(name, []byte(strings.Join(slices.Compact(lines), "\n")+"\n"), 0o644)
}

// versionLess orders go.sum versions as module.Sort does: by semantic
// version, then by the suffix after a slash ("/go.mod" after none).
func versionLess(a, b string) bool {
	av, as, _ := strings.Cut(a, "/")
	bv, bs, _ := strings.Cut(b, "/")
	if c := semver.Compare(av, bv); c != 0 {
		return c < 0
	}
	return as < bs
}

// worktreeSums returns the go.sum lines of module m at version, with its
// go.mod as gomod and its other files as the working tree has them (the
// ones git tracks or does not ignore).
func worktreeSums(root string, m *mod, version string, gomod []byte) ([]string, error) {
	out, err := git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", m.dir)
	if err != nil {
		return nil, err
	}
	var files []modzip.File
	haveLicense := false
	for _, name := range strings.Split(strings.TrimRight(out, "\x00"), "\x00") {
		if name == "" {
			continue
		}
		rel := name
		if m.dir != "." {
			rel = strings.TrimPrefix(name, m.dir+"/")
		}
		full := filepath.Join(root, filepath.FromSlash(name))
		fi, err := os.Lstat(full)
		if errors.Is(err, fs.ErrNotExist) {
			continue // tracked, deleted in the working tree
		} else if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(files, func(f modzip.File) bool { return f.Path() == rel }) {
			continue
		}
		files = append(files, diskFile{rel: rel, full: full, info: fi})
		haveLicense = haveLicense || rel == "LICENSE"
	}
	if !haveLicense && m.dir != "." {
		// As the go command does: a module in a subdirectory without a
		// LICENSE gets the repository root's.
		full := filepath.Join(root, "LICENSE")
		if fi, err := os.Lstat(full); err == nil {
			files = append(files, diskFile{rel: "LICENSE", full: full, info: fi})
		}
	}
	tmp, err := os.CreateTemp("", "modrelease-*.zip")
	if err != nil {
		return nil, err
	}
	defer func() { _ = tmp.Close(); _ = os.Remove(tmp.Name()) }()
	v := module.Version{Path: m.path, Version: version}
	if err := modzip.Create(tmp, v, files); err != nil {
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	zh, err := dirhash.HashZip(tmp.Name(), dirhash.Hash1)
	if err != nil {
		return nil, err
	}
	mh, err := modHash(gomod)
	if err != nil {
		return nil, err
	}
	return []string{m.path + " " + version + " " + zh, m.path + " " + version + "/go.mod " + mh}, nil
}

// modHash is the h1: hash of a go.mod file, as go.sum's "/go.mod" lines
// hold it.
func modHash(data []byte) (string, error) {
	return dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
}

// diskFile is a file of the working tree, as golang.org/x/mod/zip reads it.
type diskFile struct {
	rel, full string
	info      fs.FileInfo
}

func (f diskFile) Path() string                 { return f.rel }
func (f diskFile) Lstat() (fs.FileInfo, error)  { return f.info, nil }
func (f diskFile) Open() (io.ReadCloser, error) { return os.Open(f.full) }

// check reports every way the modules' files stray from the rule.
func check(root string) error {
	wf, mods, err := workspace(root)
	if err != nil {
		return err
	}
	own := map[string]*mod{}
	for _, m := range mods {
		own[m.path] = m
	}
	var problems []string
	versions := map[string][]string{} // version: the requirements naming it
	for _, m := range mods {
		name := path.Join(m.dir, "go.mod")
		for _, r := range m.file.Replace {
			problems = append(problems, fmt.Sprintf("%s: replace %s: no go.mod here may replace a module (go install ...@version refuses one that does, and a module requiring it ignores it); go.work replaces the repository's modules with their directories", name, r.Old.Path))
		}
		for _, r := range m.file.Require {
			if own[r.Mod.Path] != nil {
				versions[r.Mod.Version] = append(versions[r.Mod.Version], name+": "+r.Mod.Path+" "+r.Mod.Version)
			}
		}
	}
	version := unreleased
	switch len(versions) {
	case 0:
	case 1:
		for v := range versions {
			version = v
		}
	default:
		var all []string
		for _, reqs := range versions {
			all = append(all, reqs...)
		}
		sort.Strings(all)
		problems = append(problems, "the repository's modules require each other at more than one version (want one, the last release's; go run ./hack/modrelease require VERSION sets them):\n\t"+strings.Join(all, "\n\t"))
	}
	want := map[module.Version]string{}
	for _, m := range mods {
		if m.dir != "." {
			want[module.Version{Path: m.path, Version: version}] = "./" + m.dir
		}
	}
	for _, r := range wf.Replace {
		dir, ok := want[r.Old]
		if !ok || r.New.Version != "" || path.Clean(r.New.Path) != path.Clean(dir) {
			problems = append(problems, fmt.Sprintf("go.work: replace %s %s => %s %s: want only each module's required version (%s) replaced with its directory", r.Old.Path, r.Old.Version, r.New.Path, r.New.Version, version))
			continue
		}
		delete(want, r.Old)
	}
	for v, dir := range want {
		problems = append(problems, fmt.Sprintf("go.work: no replace %s %s => %s: without it the workspace would fetch that version of the module (go work edit -replace=%s@%s=%s)", v.Path, v.Version, dir, v.Path, v.Version, dir))
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// tagged checks the tags of every module at version in the git repository
// repo, and the modules' files at the root module's tag.
func tagged(repo, version string) error {
	if err := checkVersion(version); err != nil {
		return err
	}
	_, mods, err := workspace(repo)
	if err != nil {
		return err
	}
	want, err := git(repo, "rev-parse", "--verify", "--quiet", "refs/tags/"+version+"^{commit}")
	if err != nil {
		return fmt.Errorf("no tag %s", version)
	}
	var problems []string
	for _, m := range mods {
		if m.dir == "." {
			continue
		}
		tag := m.dir + "/" + version
		got, err := git(repo, "rev-parse", "--verify", "--quiet", "refs/tags/"+tag+"^{commit}")
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("module %s: no tag %s (hack/release-modules.sh %s makes every module's tag)", m.path, tag, version))
		case got != want:
			problems = append(problems, fmt.Sprintf("module %s: tag %s is on commit %s, %s on %s; want every module's tag on one commit", m.path, tag, strings.TrimSpace(got), version, strings.TrimSpace(want)))
		}
	}
	// The files of the tagged commit, in a directory of their own.
	tmp, err := os.MkdirTemp("", "modrelease-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	for _, m := range mods {
		for _, name := range []string{"go.mod", "go.work"} {
			if name == "go.work" && m.dir != "." {
				continue
			}
			data, err := git(repo, "show", version+":"+path.Join(m.dir, name))
			if err != nil {
				return err
			}
			full := filepath.Join(tmp, filepath.FromSlash(m.dir), name)
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
				return err
			}
		}
	}
	if err := check(tmp); err != nil {
		problems = append(problems, fmt.Sprintf("the modules at %s:\n%v", version, err))
	}
	_, tmods, err := workspace(tmp)
	if err != nil {
		return err
	}
	for _, m := range tmods {
		for _, r := range m.file.Require {
			if slices.ContainsFunc(tmods, func(o *mod) bool { return o.path == r.Mod.Path }) && r.Mod.Version != version {
				problems = append(problems, fmt.Sprintf("%s at %s requires %s %s, want %s", path.Join(m.dir, "go.mod"), version, r.Mod.Path, r.Mod.Version, version))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// proxy writes the module proxy files of every module at version, from its
// tag in repo.
func proxy(repo, out, version string) error {
	if err := checkVersion(version); err != nil {
		return err
	}
	repo, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	_, mods, err := workspace(repo)
	if err != nil {
		return err
	}
	for _, m := range mods {
		tag, subdir := version, ""
		if m.dir != "." {
			tag, subdir = m.dir+"/"+version, m.dir
		}
		if _, err := git(repo, "rev-parse", "--verify", "--quiet", "refs/tags/"+tag); err != nil {
			return fmt.Errorf("module %s: no tag %s in %s", m.path, tag, repo)
		}
		epath, err := module.EscapePath(m.path)
		if err != nil {
			return err
		}
		evers, err := module.EscapeVersion(version)
		if err != nil {
			return err
		}
		dir := filepath.Join(out, filepath.FromSlash(epath), "@v")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		gomod, err := git(repo, "show", tag+":"+path.Join(m.dir, "go.mod"))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, evers+".mod"), []byte(gomod), 0o644); err != nil {
			return err
		}
		when, err := git(repo, "log", "-1", "--format=%cI", tag)
		if err != nil {
			return err
		}
		info, err := json.Marshal(struct{ Version, Time string }{version, strings.TrimSpace(when)})
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, evers+".info"), info, 0o644); err != nil {
			return err
		}
		var zip bytes.Buffer
		if err := modzip.CreateFromVCS(&zip, module.Version{Path: m.path, Version: version}, repo, tag, subdir); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, evers+".zip"), zip.Bytes(), 0o644); err != nil {
			return err
		}
		list, err := os.ReadFile(filepath.Join(dir, "list"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		vs := strings.Fields(string(list))
		if !slices.Contains(vs, version) {
			vs = append(vs, version)
		}
		semver.Sort(vs)
		if err := os.WriteFile(filepath.Join(dir, "list"), []byte(strings.Join(vs, "\n")+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// git runs git in dir and returns its standard output.
func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
