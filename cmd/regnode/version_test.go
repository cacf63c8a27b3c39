package main_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestVersion checks that regnode --version prints the build's module and
// revision (unknown here: the test binary is built unstamped) and exits 0
// without starting anything.
func TestVersion(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(binary, "--version")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("regnode --version: %v\n%s", err, out)
	}
	if s := string(out); !strings.HasPrefix(s, "regnode github.com/regcluster/registry ") || !strings.Contains(s, "revision ") || strings.Count(s, "\n") != 1 {
		t.Errorf("regnode --version = %q, want one line naming the module and the revision", s)
	}
	if ents, _ := exec.Command("ls", "-A", dir).Output(); len(ents) != 0 {
		t.Errorf("regnode --version left files behind: %s", ents)
	}
}
