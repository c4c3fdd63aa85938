package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
)

// ErrSecretFile wraps every problem with a secret file.
var ErrSecretFile = errors.New("cluster: secret file")

// ReadSecretFile reads a secret file: the secret as text, surrounding white
// space ignored (for example 64 hex characters and a newline). The file must
// not be readable or writable by others, and the secret must be at least 16
// bytes.
func ReadSecretFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSecretFile, err)
	}
	if fi.Mode().Perm()&0o007 != 0 {
		return nil, fmt.Errorf("%w: %s is accessible to others (mode %v); run chmod 600 %s",
			ErrSecretFile, path, fi.Mode().Perm(), path)
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
