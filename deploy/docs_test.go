package deploy

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocsLinkInsideTheRepository checks every relative Markdown link of
// README.md and docs/*.md: it must name a file of this repository (a
// clone has nothing beside it), and an anchor into docs must exist.
func TestDocsLinkInsideTheRepository(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	if len(files) < 3 {
		t.Fatalf("want README.md and docs/architecture.md, docs/operations.md; got %v", files)
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, f := range files {
		text := string(readFile(t, f))
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			abs := f
			if path != "" {
				abs = filepath.Join(filepath.Dir(f), path)
			}
			rel, err := filepath.Rel(root, abs)
			if err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s links %q, outside the repository", filepath.Base(f), target)
				continue
			}
			b, err := os.ReadFile(abs)
			if err != nil {
				t.Errorf("%s links %q: %v", filepath.Base(f), target, err)
				continue
			}
			if anchor != "" && !hasAnchor(string(b), anchor) {
				t.Errorf("%s links %q: no heading makes that anchor", filepath.Base(f), target)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the README must link its docs")
	}
}

// hasAnchor reports whether a Markdown heading of text gets the GitHub
// anchor a (lower case, punctuation dropped, spaces as '-').
func hasAnchor(text, a string) bool {
	for _, line := range strings.Split(text, "\n") {
		h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(h)) {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		if b.String() == a {
			return true
		}
	}
	return false
}

// TestDocsRegnodeFlags checks that every flag the README and docs give a
// regnode command line (a line of a code block running ./bin/regnode, and
// its continuation lines) is one regnode accepts, so the commands stay
// true as flags change.
func TestDocsRegnodeFlags(t *testing.T) {
	flags := regnodeFlags(t)
	files, _ := filepath.Glob("../docs/*.md")
	files = append(files, "../README.md")
	flag := regexp.MustCompile(`(?:^|\s)--([a-z][a-z0-9-]*)`)
	seen := 0
	for _, f := range files {
		inBlock, inCmd := false, false
		for _, line := range strings.Split(string(readFile(t, f)), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inBlock, inCmd = !inBlock, false
				continue
			}
			if !inBlock {
				continue
			}
			if strings.Contains(line, "./bin/regnode ") {
				inCmd = true
			}
			if !inCmd {
				continue
			}
			code, _, _ := strings.Cut(line, "#") // comments are prose
			for _, m := range flag.FindAllStringSubmatch(code, -1) {
				seen++
				if !flags[m[1]] {
					t.Errorf("%s: %q gives regnode --%s, which it does not accept", filepath.Base(f), strings.TrimSpace(line), m[1])
				}
			}
			inCmd = strings.HasSuffix(strings.TrimSpace(line), "\\")
		}
	}
	if seen < 10 {
		t.Fatalf("found only %d regnode flags in the docs' commands: the scan is broken", seen)
	}
}

// TestDocsRegctlCommands checks every regctl command the README and docs
// give (a line of a code block running ./bin/regctl, and its continuation
// lines): its words must name a command regctl has (`drain`, `token
// create`, `completion bash`), and every flag on it must be one that
// command accepts, its own or a global one. regctl is built from this
// repository and asked for each command's --help, so the commands stay
// true as regctl changes.
func TestDocsRegctlCommands(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "regctl")
	build := exec.Command("go", "build", "-o", bin, "./cmd/regctl")
	build.Dir = ".." // the registry's own module
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build regctl: %v\n%s", err, out)
	}
	h := &regctlHelp{bin: bin, cmds: map[string]*regctlCmd{}}
	root := h.command(t, nil)
	if !root.ok || !root.flags["endpoints"] || root.short["o"] != "output" {
		t.Fatalf("regctl --help: no usage, --endpoints or -o found: %+v", root)
	}
	files, _ := filepath.Glob("../docs/*.md")
	files = append(files, "../README.md")
	lines, commands := 0, map[string]bool{}
	for _, f := range files {
	cmds:
		for _, cmd := range docCommands(string(readFile(t, f)), "./bin/regctl ") {
			lines++
			where := fmt.Sprintf("%s: regctl %s", filepath.Base(f), cmd)
			var path []string
			c := root
			words := strings.Fields(cmd)
			for i := 0; i < len(words); i++ {
				w := words[i]
				if strings.HasPrefix(w, "-") {
					name, _, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
					if !strings.HasPrefix(w, "--") {
						name = c.short[name]
					}
					takesValue, ok := c.flags[name]
					if !ok || name == "help" {
						t.Errorf("%s: regctl %s does not accept %s", where, strings.Join(path, " "), w)
						continue
					}
					if takesValue && !hasValue {
						i++ // its value
					}
					continue
				}
				if sub := h.sub(t, path, w); sub != nil {
					path, c = append(path, w), sub
					continue
				}
				if c.hasSubs { // a command of commands takes no argument
					t.Errorf("%s: %q has no command %q", where, strings.Join(append([]string{"regctl"}, path...), " "), w)
					continue cmds
				}
				// else an argument (SERVICE/ID, a service name)
			}
			if len(path) == 0 {
				t.Errorf("%s: names no regctl command", where)
				continue
			}
			commands[strings.Join(path, " ")] = true
		}
	}
	t.Logf("%d regctl command lines, %d commands: %v", lines, len(commands), slices.Sorted(maps.Keys(commands)))
	if lines < 20 || len(commands) < 10 {
		t.Fatalf("found %d regctl command lines naming %d commands in the docs: the scan is broken", lines, len(commands))
	}
}

// docCommands returns, from the code blocks of a Markdown text, what
// follows prefix on each line that holds it, continuation lines (a
// trailing backslash) joined, up to shell syntax that ends the command
// (`)`, `|`, `<`, `>`, `&`, `;`) or a comment.
func docCommands(text, prefix string) []string {
	var cmds []string
	inBlock, cont := false, false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inBlock, cont = !inBlock, false
			continue
		}
		if !inBlock {
			continue
		}
		code := line
		if cont {
			cmds[len(cmds)-1] += " " // the continued command goes on
		} else if _, after, ok := strings.Cut(line, prefix); ok {
			cmds, code = append(cmds, ""), after
		} else {
			continue
		}
		trimmed := strings.TrimSpace(code)
		cont = strings.HasSuffix(trimmed, "\\")
		code = strings.TrimSuffix(trimmed, "\\")
		if i := strings.IndexAny(code, ")|<>&;#"); i >= 0 {
			code, cont = code[:i], false
		}
		cmds[len(cmds)-1] += strings.TrimSpace(code)
	}
	return cmds
}

// regctlHelp asks a regctl binary for its commands' help, each once.
type regctlHelp struct {
	bin  string
	cmds map[string]*regctlCmd
}

// regctlCmd is what `regctl PATH --help` says of a command.
type regctlCmd struct {
	ok      bool              // exit 0, and its usage line is of this very command
	hasSubs bool              // it lists commands of its own
	flags   map[string]bool   // long flags, its own and global: does each take a value
	short   map[string]string // shorthand -> long name
}

var (
	helpFlag  = regexp.MustCompile(`(?m)^\s+(?:-(\w), )?--([a-z0-9-]+)( \w+)?\s\s`)
	helpUsage = regexp.MustCompile(`(?m)^Usage:\n\s+(.*)$`)
	wordRE    = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
)

// command runs `regctl PATH --help`. cobra answers --help of a command it
// does not have with the root's help and exit 0, so a command is regctl's
// only if its usage line starts with its own path.
func (h *regctlHelp) command(t *testing.T, path []string) *regctlCmd {
	t.Helper()
	key := strings.Join(path, " ")
	if c, ok := h.cmds[key]; ok {
		return c
	}
	c := &regctlCmd{flags: map[string]bool{}, short: map[string]string{}}
	h.cmds[key] = c
	out, err := exec.Command(h.bin, append(append([]string{}, path...), "--help")...).Output()
	if err != nil {
		return c
	}
	m := helpUsage.FindSubmatch(out)
	want := strings.TrimSpace("regctl " + key)
	if m == nil || !(string(m[1]) == want || strings.HasPrefix(string(m[1]), want+" ")) {
		return c
	}
	c.ok = true
	c.hasSubs = strings.Contains(string(out), "\nAvailable Commands:\n")
	_, flags, _ := strings.Cut(string(out), "\nFlags:\n")
	for _, f := range helpFlag.FindAllStringSubmatch(flags, -1) {
		c.flags[f[2]] = f[3] != ""
		if f[1] != "" {
			c.short[f[1]] = f[2]
		}
	}
	return c
}

// sub returns regctl's command PATH WORD, or nil if WORD is no command
// of PATH (an argument).
func (h *regctlHelp) sub(t *testing.T, path []string, word string) *regctlCmd {
	t.Helper()
	if !wordRE.MatchString(word) {
		return nil
	}
	if c := h.command(t, append(append([]string{}, path...), word)); c.ok {
		return c
	}
	return nil
}

// TestReadmeFirstScreen checks that README.md stays a newcomer's page: at
// most 150 lines, with `make run` and `make test` in its first 30.
func TestReadmeFirstScreen(t *testing.T) {
	lines := strings.Split(strings.TrimRight(string(readFile(t, "../README.md")), "\n"), "\n")
	if len(lines) > 150 {
		t.Errorf("README.md has %d lines; at most 150: move reference into docs/", len(lines))
	}
	first := strings.Join(lines[:min(30, len(lines))], "\n")
	for _, cmd := range []string{"make run", "make test"} {
		if !strings.Contains(first, cmd) {
			t.Errorf("README.md's first 30 lines do not give %q", cmd)
		}
	}
}

// TestDocsPackages checks every package table (a table headed
// "| package | owns |") of README.md and docs/*.md: every name in its
// first column is a directory of the repository. docs/architecture.md must
// have one, and it must name every Go package the repository has, so a
// renamed, removed or new package shows up here.
func TestDocsPackages(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	name := regexp.MustCompile("`([^`]+)`")
	var arch map[string]bool
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		named := map[string]bool{}
		tables, in := 0, false
		for _, line := range strings.Split(string(readFile(t, f)), "\n") {
			switch {
			case strings.HasPrefix(line, "| package | owns |"):
				in = true
				tables++
			case in && strings.HasPrefix(line, "|"):
				cells := strings.Split(line, "|")
				for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
					p := m[1]
					named[p] = true
					if fi, err := os.Stat(filepath.Join(root, p)); err != nil || !fi.IsDir() {
						t.Errorf("%s's package table names %q, which is no directory of the repository", rel, p)
					}
				}
			default:
				in = false
			}
		}
		if rel == filepath.Join("docs", "architecture.md") {
			if tables == 0 {
				t.Fatal("docs/architecture.md has no package table (\"| package | owns |\")")
			}
			if len(named) < 30 {
				t.Fatalf("docs/architecture.md: found %d packages in its package table: the scan is broken", len(named))
			}
			arch = named
		}
	}
	if arch == nil {
		t.Fatal("docs/architecture.md not found")
	}
	seen := map[string]bool{}
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if base := d.Name(); base == ".git" || base == "testdata" || strings.HasPrefix(base, ".") && rel != "." ||
				strings.HasPrefix(rel, "deploy"+string(filepath.Separator)) {
				return filepath.SkipDir // deploy's own files are one entry, `deploy`
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		if dir == "." {
			return nil
		}
		if !arch[dir] && !seen[dir] {
			t.Errorf("docs/architecture.md's package table does not name package %s", dir)
		}
		seen[dir] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 30 {
		t.Fatalf("found %d Go packages in the repository: the walk is broken", len(seen))
	}
	if !arch["deploy"] {
		t.Error("docs/architecture.md's package table does not name the nested module deploy")
	}
}
