package cluster

import (
	"bytes"
	"fmt"
	"os"
)

// ReadSecretFile reads a secret file: the secret as text, surrounding white
// space ignored (for example 64 hex characters and a newline), at least 16
// bytes.
//
// The rule for its mode: others may have no access at all, and its group
// may at most read it. So 0600 and 0400, and 0640 and 0440 for a file owned
// by root whose group is the service's (packaging/README.md installs the
// secrets 0640 root:ticketing: the node reads them and cannot change them);
// a file its group may write, or that others may read, is refused.
func ReadSecretFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSecretFile, err)
	}
	if perm := fi.Mode().Perm(); perm&0o037 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %04o: others may have no access and the group at most read "+
			"access; run chmod 600 %s (or chmod 640 for a root-owned file in the service's group)",
			ErrSecretFile, path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSecretFile, err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < 16 {
		return nil, fmt.Errorf("%w: %s holds %d bytes; at least 16 are required", ErrSecretFile, path, len(b))
	}
	return b, nil
}
