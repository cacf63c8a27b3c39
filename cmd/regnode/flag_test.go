package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// Every flag a refusal can be mapped to is one regnode has.
func TestFlagOfNamesRealFlags(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	code := run([]string{"--help"})
	os.Stdout = stdout
	w.Close()
	out, err := io.ReadAll(r)
	if err != nil || code != 0 {
		t.Fatalf("regnode --help: exit %d, %v", code, err)
	}
	for field, flags := range flagOf {
		for _, f := range strings.FieldsFunc(flags, func(r rune) bool { return r == ',' || r == ' ' }) {
			if f != "or" && !strings.Contains(string(out), f+" ") {
				t.Errorf("flagOf[%q] names %s, which regnode --help does not list", field, f)
			}
		}
	}
}
