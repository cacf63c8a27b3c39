package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/regcluster/registry", Version: "v0.2.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	in := FromBuildInfo(stamped)
	want := Info{Module: "github.com/regcluster/registry", Version: "v0.2.0", Revision: "0123456789abcdef", Time: "2026-12-01T10:00:00Z", Modified: true, GoVersion: "go1.26.0"}
	if in != want {
		t.Fatalf("FromBuildInfo = %+v, want %+v", in, want)
	}
	if got, w := in.String(), "github.com/regcluster/registry v0.2.0, revision 0123456789abcdef (modified), go1.26.0"; got != w {
		t.Errorf("String() = %q, want %q", got, w)
	}

	// -buildvcs=false: no vcs.* settings, no version from a work tree.
	bare := FromBuildInfo(&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/regcluster/registry"}})
	if bare.Revision != "" || bare.Modified || bare.Version != "(devel)" {
		t.Fatalf("unstamped build = %+v", bare)
	}
	if s := bare.String(); !strings.Contains(s, "revision unknown") || !strings.Contains(s, "-buildvcs=false") {
		t.Errorf("unstamped String() = %q, want it to say the revision is unknown and why", s)
	}
}

func TestReadNamesTheModule(t *testing.T) {
	// A test binary's main module is this one's.
	if in := Read(); in.Module != "github.com/regcluster/registry" || in.GoVersion == "" {
		t.Errorf("Read() = %+v", in)
	}
}
