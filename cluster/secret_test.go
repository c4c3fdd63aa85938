package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The secret-file mode rule (docs/security.md, packaging/README.md):
// others no access, the group at most read.
func TestReadSecretFileModes(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		mode os.FileMode
		ok   bool
	}{
		{0o600, true}, {0o400, true}, {0o640, true}, {0o440, true},
		{0o660, false}, {0o620, false}, {0o610, false}, {0o644, false}, {0o604, false}, {0o602, false}, {0o601, false},
		{0o666, false}, {0o700, true}, {0o750, false},
	} {
		p := filepath.Join(dir, "s")
		os.Remove(p)
		if err := os.WriteFile(p, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, tc.mode); err != nil {
			t.Fatal(err)
		}
		b, err := ReadSecretFile(p)
		switch {
		case tc.ok && (err != nil || string(b) != "0123456789abcdef0123456789abcdef"):
			t.Errorf("mode %04o: %q %v, want it read", tc.mode, b, err)
		case !tc.ok && !errors.Is(err, ErrSecretFile):
			t.Errorf("mode %04o: %v, want a refusal", tc.mode, err)
		}
	}
}
