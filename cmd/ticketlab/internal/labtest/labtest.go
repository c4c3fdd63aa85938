// Package labtest gives the lab's tests the two executables they drive:
// the ticketing binary under test and the ticketlab binary itself (its
// `node`, `sidecar` and `verify worker` commands).
package labtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Ticketing returns the ticketing executable: $TICKETING_BIN when set
// (make builds it once), else a fresh build in a temporary directory,
// which cleanup removes. It is built in its own module (its go.mod, not
// the lab's), as it ships.
func Ticketing() (bin string, cleanup func(), err error) {
	if bin := os.Getenv("TICKETING_BIN"); bin != "" {
		return bin, func() {}, nil
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "ticketing").Output()
	if err != nil {
		return "", nil, fmt.Errorf("locating the ticketing module: %w", err)
	}
	return build(strings.TrimSpace(string(root)), "ticketing", "./cmd/ticketing")
}

// Lab returns the ticketlab executable: $TICKETLAB_BIN when set, else a
// fresh build in a temporary directory, which cleanup removes.
func Lab() (bin string, cleanup func(), err error) {
	if bin := os.Getenv("TICKETLAB_BIN"); bin != "" {
		return bin, func() {}, nil
	}
	return build("", "ticketlab", "ticketing/cmd/ticketlab")
}

// build builds pkg in dir ("": here) into a new temporary directory.
func build(dir, name, pkg string) (string, func(), error) {
	tmp, err := os.MkdirTemp("", "ticketlab-test-bin-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(tmp) }
	out := filepath.Join(tmp, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return out, cleanup, nil
}
