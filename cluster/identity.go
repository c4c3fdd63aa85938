package cluster

import (
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"ticketing/cluster/wire"
)

// A node's Raft server id is NAME/INCARNATION: the configured node id and a
// random incarnation created together with the data dir (file "identity").
// hashicorp/raft counts a vote under the id it dialled, and the peer
// handshake makes the answering node prove exactly that id; so a node whose
// data dir was wiped, which gets a new incarnation, is a different server:
// it can neither vote nor be counted in a commit under its old identity,
// and can only come back as a new learner. (A wiped node answering under
// its old id could otherwise vote for a candidate that lacks a committed
// entry, and that entry could be overwritten.)

// identityFile holds "NAME/INCARNATION\n" in the data dir.
const identityFile = "identity"

// incarnationLen is the length of an incarnation: 10 base32 characters (50
// random bits; it only has to differ from the earlier incarnations of the
// same node name).
const incarnationLen = 10

// ServerID joins a node name and an incarnation.
func ServerID(name, incarnation string) string { return name + "/" + incarnation }

// SplitServerID splits NAME/INCARNATION; a bare name has no incarnation.
// (wire.SplitServerID, for the tools that do not link the node.)
func SplitServerID(id string) (name, incarnation string) { return wire.SplitServerID(id) }

// loadIdentity returns the server id stored in dataDir, creating a new
// incarnation when the data dir is fresh (hasState false and no identity
// file). A data dir with Raft state but no identity, or one that belongs to
// another node name, is refused.
func loadIdentity(dataDir, name string, hasState bool) (serverID string, created bool, err error) {
	path := filepath.Join(dataDir, identityFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(b))
		n, inc := SplitServerID(id)
		if inc == "" || len(inc) != incarnationLen {
			return "", false, fmt.Errorf("%w: %s holds %q, not NAME/INCARNATION", ErrIdentity, path, id)
		}
		if n != name {
			return "", false, fmt.Errorf("%w: %s belongs to node %q, not %q", ErrIdentity, dataDir, n, name)
		}
		return id, false, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", false, fmt.Errorf("%w: %w", ErrIdentity, err)
	case hasState:
		return "", false, fmt.Errorf("%w: %s has Raft state but no %s file; it was not created by this version "+
			"or was tampered with, and cannot be trusted to be the same server", ErrIdentity, dataDir, identityFile)
	}
	var raw [8]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", false, err
	}
	inc := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(raw[:]))[:incarnationLen]
	id := ServerID(name, inc)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
		return "", false, fmt.Errorf("%w: %w", ErrIdentity, err)
	}
	if err := syncFile(tmp); err != nil {
		return "", false, fmt.Errorf("%w: %w", ErrIdentity, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", false, fmt.Errorf("%w: %w", ErrIdentity, err)
	}
	// The rename is durable only once the directory is synced. Until then
	// a crash may lose the file, and the node would come back under a new
	// incarnation after having spoken under this one: refuse to start
	// instead, and remove the file so that a retry starts over.
	if err := syncDir(dataDir); err != nil {
		os.Remove(path)
		return "", false, fmt.Errorf("%w: syncing %s after writing %s: %w", ErrIdentity, dataDir, identityFile, err)
	}
	return id, true, nil
}

// syncDir fsyncs directory dir, making the renames in it durable. A
// variable only so that a test can make it fail: no file system at hand
// fails a directory's fsync on demand.
var syncDir = func(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
