package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release version. The Debian build sets it
// (packaging/build-deb.sh: -ldflags "-X ticketing/cmd/internal/cli.Version=1.2.3");
// when empty, --version reports the module version from the build info
// ("devel" for a build inside the checkout).
var Version string

// Commit is the commit the binary was built from, set the same way by
// builds that do not stamp version control information into the binary
// (go build -buildvcs=false); when empty, it comes from the build info.
var Commit string

// versionLine is what `ticketing --version` prints: the version, the
// commit the binary was built from (with its time, and "modified" when the
// work tree had changes), and the Go toolchain and platform, e.g.
//
//	ticketing 1.2.3, commit 128d5b6e2f4c (2026-11-30T17:00:00Z), go1.26.8 linux/amd64
func versionLine() string {
	v, commit, when, modified := Version, Commit, "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if commit == "" {
					commit = s.Value
				}
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	if commit == "" {
		commit = "unknown"
	}
	if len(commit) > 12 {
		commit = commit[:12]
	}
	var detail string
	switch {
	case when != "" && modified:
		detail = " (" + when + ", modified)"
	case when != "":
		detail = " (" + when + ")"
	case modified:
		detail = " (modified)"
	}
	return fmt.Sprintf("ticketing %s, commit %s%s, %s %s/%s", v, commit, detail, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
