// Package buildinfo says which build of the registry a binary is: the
// module version and the VCS revision the Go toolchain stamped into it
// (runtime/debug.ReadBuildInfo). A binary built without VCS stamping
// (-buildvcs=false, or from a tree that is not a git checkout) has no
// revision, and says so instead of printing an empty one.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Info is what a binary knows about its own build. The JSON names are
// those of `regctl version -o json`.
type Info struct {
	// Module is the main module's path.
	Module string `json:"module"`
	// Version is the main module's version: the tag or pseudo-version of
	// `go install module@version`, or of the commit a stamped build of a
	// git checkout was made from; "(devel)" for an unstamped build.
	Version string `json:"version"`
	// Revision is the VCS commit, "" when the build was not stamped.
	Revision string `json:"revision"`
	// Time is the commit's time (RFC 3339), "" when not stamped.
	Time string `json:"time,omitempty"`
	// Modified is true when the work tree had uncommitted changes.
	Modified bool `json:"modified"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"go"`
}

// Read returns the running binary's build information. It never fails: a
// binary without build information (not built in module mode) reports
// version "unknown".
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Module: "unknown", Version: "unknown"}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo extracts Info from bi (Read's work, separate so it can be
// given any build info).
func FromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Module: bi.Main.Path, Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if in.Version == "" {
		in.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// String is one line: module, version, revision (or why there is none)
// and toolchain, e.g. "github.com/regcluster/registry (devel), revision
// 0123abcd... (modified), go1.26.0".
func (in Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s, ", in.Module, in.Version)
	if in.Revision == "" {
		b.WriteString("revision unknown (built without VCS stamping: -buildvcs=false or not a git checkout)")
	} else {
		fmt.Fprintf(&b, "revision %s", in.Revision)
		if in.Modified {
			b.WriteString(" (modified)")
		}
	}
	if in.GoVersion != "" {
		fmt.Fprintf(&b, ", %s", in.GoVersion)
	}
	return b.String()
}
