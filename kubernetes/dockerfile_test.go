package kubernetes

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"golang.org/x/mod/modfile"
)

// The repository root: the Docker build context.
const repoRoot = ".."

// images are the Dockerfile's final targets, each the command of the same name.
var images = []string{"dispatcher", "worker-agent", "log-collector"}

// stage is one FROM block of the Dockerfile.
type stage struct {
	name, base string
	nodes      []*parser.Node
}

func parseDockerfile(t *testing.T) (stages []stage) {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "docker/Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("parse docker/Dockerfile: %v", err)
	}
	args := map[string]string{}
	for _, n := range res.AST.Children {
		n.Value = strings.ToLower(n.Value) // the instruction; buildkit versions differ in case
		switch {
		case n.Value == "arg" && len(stages) == 0: // global ARGs, usable in FROM
			if k, v, ok := strings.Cut(n.Next.Value, "="); ok {
				args[k] = v
			}
		case n.Value == "from":
			s := stage{base: os.Expand(n.Next.Value, func(k string) string { return args[k] })}
			if as := n.Next.Next; as != nil && strings.EqualFold(as.Value, "as") && as.Next != nil {
				s.name = as.Next.Value
			}
			stages = append(stages, s)
		case len(stages) > 0:
			stages[len(stages)-1].nodes = append(stages[len(stages)-1].nodes, n)
		}
	}
	return stages
}

func words(n *parser.Node) []string {
	var out []string
	for a := n.Next; a != nil; a = a.Next {
		out = append(out, a.Value)
	}
	return out
}

var goBuild = regexp.MustCompile(`go -C (\S+) build .*-o (\S+) (\./\S+)`)

// The Dockerfile read as text: multi-stage, static, non-root, and every path it builds from
// exists in the workspace (Docker itself cannot run here; see README "Kubernetes").
func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t)
	byName := map[string]stage{}
	for _, s := range stages {
		byName[s.name] = s
	}

	// The builder's Go is the workspace's.
	work, err := os.ReadFile(filepath.Join(repoRoot, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	wf, err := modfile.ParseWork("go.work", work, nil)
	if err != nil {
		t.Fatal(err)
	}
	source := byName["source"]
	if want := "golang:" + wf.Go.Version; source.base != want {
		t.Errorf("Dockerfile builds with %q, go.work says go %s (want %s)", source.base, wf.Go.Version, want)
	}
	env := map[string]string{}
	copied := map[string]bool{} // module directories copied whole into the build stage
	for _, n := range source.nodes {
		switch n.Value {
		case "env":
			w := words(n) // key, value, "=" per pair
			for i := 0; i+1 < len(w); i += 3 {
				env[w[i]] = w[i+1]
			}
		case "copy":
			// A whole module directory (COPY dir/ dir/); the go.mod-only copies do not count.
			if w := words(n); len(w) == 2 && strings.TrimSuffix(w[0], "/") == strings.TrimSuffix(w[1], "/") {
				copied[strings.TrimSuffix(w[0], "/")] = true
			}
		}
	}
	if env["CGO_ENABLED"] != "0" {
		t.Errorf("build stage CGO_ENABLED = %q, want 0 (static binaries for distroless static)", env["CGO_ENABLED"])
	}
	for dir := range copied {
		if _, err := os.Stat(filepath.Join(repoRoot, dir)); err != nil {
			t.Errorf("Dockerfile copies %s: %v", dir, err)
		}
	}

	for _, image := range images {
		final, ok := byName[image]
		if !ok {
			t.Errorf("no target %q", image)
			continue
		}
		if !strings.HasPrefix(final.base, "gcr.io/distroless/static") || !strings.HasSuffix(final.base, ":nonroot") {
			t.Errorf("%s: runtime image %q, want distroless static :nonroot", image, final.base)
		}
		var user, entrypoint string
		var from string
		for _, n := range final.nodes {
			switch n.Value {
			case "user":
				user = n.Next.Value
			case "entrypoint":
				entrypoint = strings.Join(words(n), " ")
			case "copy":
				for _, fl := range n.Flags {
					if s, ok := strings.CutPrefix(fl, "--from="); ok {
						from = s
					}
				}
			}
		}
		if user == "" || user == "root" || strings.HasPrefix(user, "0") {
			t.Errorf("%s: USER %q, want a non-root user", image, user)
		}
		build, ok := byName[from]
		if !ok {
			t.Errorf("%s: copies its binary from %q, not a stage of this file", image, from)
			continue
		}
		if build.base != "source" {
			t.Errorf("%s: build stage %q is not based on the source stage", image, from)
		}
		var m []string
		for _, n := range build.nodes {
			if n.Value == "run" {
				if m = goBuild.FindStringSubmatch(n.Original); m != nil {
					break
				}
			}
		}
		if m == nil {
			t.Errorf("%s: stage %s has no `go -C MODULE build -o OUT ./PKG`", image, from)
			continue
		}
		module, out, pkg := m[1], m[2], m[3]
		if !strings.Contains(entrypoint, "/usr/local/bin/"+image) || !strings.HasSuffix(out, "/"+image) {
			t.Errorf("%s: builds %s but the entrypoint is %s", image, out, entrypoint)
		}
		checkMainPackage(t, filepath.Join(repoRoot, module, pkg))
		// The module and every local module it replaces must be in the build stage.
		for _, dir := range localModules(t, filepath.Join(repoRoot, module)) {
			if !copied[dir] {
				t.Errorf("%s: module %s needs %s, which the Dockerfile does not copy", image, module, dir)
			}
		}
	}

	checkDockerignore(t, copied)
}

func checkMainPackage(t *testing.T, dir string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && !strings.HasSuffix(f, "_test.go") && regexp.MustCompile(`(?m)^package main$`).Match(b) {
			return
		}
	}
	t.Errorf("%s: no package main to build", dir)
}

// localModules returns the module's directory and those of the modules it replaces with
// local paths, relative to the repository root.
func localModules(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mf, err := modfile.Parse("go.mod", b, nil)
	if err != nil {
		t.Fatal(err)
	}
	rel := func(p string) string {
		r, err := filepath.Rel(repoRoot, p)
		if err != nil {
			t.Fatal(err)
		}
		return filepath.ToSlash(r)
	}
	out := []string{rel(dir)}
	for _, r := range mf.Replace {
		if modfile.IsDirectoryPath(r.New.Path) {
			out = append(out, rel(filepath.Join(dir, r.New.Path)))
		}
	}
	return out
}

// checkDockerignore asserts the build context keeps what the build needs and leaves out
// the rest (git history, binaries, the heavy kubernetes module).
func checkDockerignore(t *testing.T, copied map[string]bool) {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	excluded := func(p string) bool {
		ex, err := pm.MatchesOrParentMatches(p)
		if err != nil {
			t.Fatal(err)
		}
		return ex
	}
	for _, dir := range slices.Sorted(maps.Keys(copied)) {
		for _, p := range []string{dir + "/go.mod", dir + "/go.sum"} {
			if excluded(p) {
				t.Errorf(".dockerignore leaves out %s, which the build copies", p)
			}
		}
	}
	if excluded("dispatcher/cmd/dispatcher/main.go") {
		t.Error(".dockerignore leaves out the dispatcher's main.go")
	}
	for _, p := range []string{".git/HEAD", "bin/dispatcher", "kubernetes/go.mod", "dispatcher/dispatcher_test.go"} {
		if !excluded(p) {
			t.Errorf(".dockerignore lets %s into the build context", p)
		}
	}
}

// versionVar is a version string that -ldflags -X sets at build time.
var versionVar = regexp.MustCompile(`(?m)^var Version = "`)

// Every `var Version` of a module an image builds (the agent's, which it reports in its
// hello and to the collector) is stamped from an ARG VERSION with a default, and `task
// images` passes one: unstamped, every agent in a fleet reports "dev".
func TestDockerfileStampsTheVersion(t *testing.T) {
	byName := map[string]stage{}
	for _, s := range parseDockerfile(t) {
		byName[s.name] = s
	}
	var stamped []string
	for _, image := range images {
		build := byName["build-"+image]
		var run string
		var arg bool
		for _, n := range build.nodes {
			switch {
			case n.Value == "arg":
				k, v, _ := strings.Cut(n.Next.Value, "=")
				arg = arg || k == "VERSION" && v != ""
			case n.Value == "run" && goBuild.MatchString(n.Original):
				run = n.Original
			}
		}
		m := goBuild.FindStringSubmatch(run)
		if m == nil {
			t.Errorf("stage build-%s has no go build", image)
			continue
		}
		for _, pkg := range versionPackages(t, m[1]) {
			if !strings.Contains(run, "-X "+pkg+".Version=${VERSION}") {
				t.Errorf("%s: %s.Version is not stamped: -X %s.Version=${VERSION} missing from %q", image, pkg, pkg, run)
			}
			if !arg {
				t.Errorf("%s: stage build-%s declares no ARG VERSION with a default", image, image)
			}
			stamped = append(stamped, pkg)
		}
	}
	if !slices.Contains(stamped, "github.com/smartroute/smartroute/worker-agent/agent") {
		t.Errorf("found Version variables in %v, not the agent's: did it move?", stamped)
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "Taskfile.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`docker build -f docker/Dockerfile .*--build-arg VERSION=\S`).Match(b) {
		t.Error("Taskfile.yml's images task passes no --build-arg VERSION")
	}
}

// versionPackages returns the import paths of the packages of module dir (relative to the
// repository root) that declare a var Version.
func versionPackages(t *testing.T, dir string) []string {
	t.Helper()
	root := filepath.Join(repoRoot, dir)
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	module := modfile.ModulePath(b)
	var pkgs []string
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.Contains(p, "testdata") {
			return err
		}
		src, err := os.ReadFile(p)
		if err != nil || !versionVar.Match(src) {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		pkgs = append(pkgs, strings.TrimSuffix(module+"/"+filepath.ToSlash(rel), "/."))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}
