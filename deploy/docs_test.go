package deploy

import (
	"os"
	"path/filepath"
	"regexp"
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

// TestDocsPackages checks the package tables (a table headed
// "| package | owns |") of README.md and docs/architecture.md: every name
// in their first column is a directory of the repository, and
// architecture.md's names every Go package the repository has, so a
// renamed, removed or new package shows up here.
func TestDocsPackages(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile("`([^`]+)`")
	tables := map[string]map[string]bool{}
	for _, f := range []string{"README.md", filepath.Join("docs", "architecture.md")} {
		named := map[string]bool{}
		in := false
		for _, line := range strings.Split(string(readFile(t, filepath.Join(root, f))), "\n") {
			switch {
			case strings.HasPrefix(line, "| package | owns |"):
				in = true
			case in && strings.HasPrefix(line, "|"):
				cells := strings.Split(line, "|")
				for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
					p := m[1]
					named[p] = true
					if fi, err := os.Stat(filepath.Join(root, p)); err != nil || !fi.IsDir() {
						t.Errorf("%s's package table names %q, which is no directory of the repository", f, p)
					}
				}
			default:
				in = false
			}
		}
		if len(named) < 10 {
			t.Fatalf("%s: found %d packages in its package table: the scan is broken", f, len(named))
		}
		tables[f] = named
	}
	arch := tables[filepath.Join("docs", "architecture.md")]
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
}
