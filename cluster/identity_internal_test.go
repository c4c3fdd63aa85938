package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A new identity whose directory fsync fails is refused (the rename that
// made it may not survive a crash, and the node would come back under
// another incarnation), and the file is removed so that a retry starts
// over; the retry, synced, creates a new one and keeps it.
func TestNewIdentityFailsClosedOnDirectorySync(t *testing.T) {
	dir := t.TempDir()
	errSync := errors.New("injected: directory fsync failed")
	real := syncDir
	syncDir = func(string) error { return errSync }
	_, created, err := loadIdentity(dir, "n1", false)
	syncDir = real
	if !errors.Is(err, ErrIdentity) || !errors.Is(err, errSync) || created {
		t.Fatalf("loadIdentity with a failing directory fsync: created %v, %v; want ErrIdentity wrapping the fsync error", created, err)
	}
	if _, err := os.Stat(filepath.Join(dir, identityFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the unsynced identity file was left behind: %v", err)
	}
	id, created, err := loadIdentity(dir, "n1", false)
	if err != nil || !created {
		t.Fatalf("retry: %q, created %v, %v", id, created, err)
	}
	again, created, err := loadIdentity(dir, "n1", true)
	if err != nil || created || again != id {
		t.Fatalf("reopen: %q, created %v, %v; want %q", again, created, err, id)
	}
}
