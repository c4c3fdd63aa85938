package unixapi_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"ticketing/locksm"
	"ticketing/unixapi"
)

// Owners have a part nobody can guess (issue 39, finding 8): the sidecar
// sends `<prefix>.<16 hex digits of crypto/rand>.<connection number>`.
// Two servers with the same prefix (two sidecar processes whose host and
// pid a stranger knows or guesses) get different random parts, and the
// connections of one server share its random part, so that an operator
// still reads host, pid and connection from an owner. With the owners
// `<prefix>.<n>` of before, a client with the cluster's secret guessed a
// victim's owner in 68 tries.
func TestOwnersHaveARandomPart(t *testing.T) {
	const prefix = "box-a/4242"
	tune := func(c *unixapi.Config) { c.OwnerPrefix = prefix }
	s1, s2 := serve(t, tune), serve(t, tune)
	form := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `\.([0-9a-f]{16})\.([0-9]+)$`)
	part := func(s *unixapi.Server) (rand, conn string) {
		t.Helper()
		owner := ownerOf(t, testCluster, dial(t, s), key(t))
		m := form.FindStringSubmatch(owner)
		if m == nil {
			t.Fatalf("owner %q, want %s.<16 hex digits>.<connection>", owner, prefix)
		}
		return m[1], m[2]
	}
	r1a, c1a := part(s1)
	r1b, c1b := part(s1)
	r2, _ := part(s2)
	if r1a != r1b || c1a == c1b {
		t.Fatalf("one server's owners %s.%s and %s.%s: want one random part, distinct connections", r1a, c1a, r1b, c1b)
	}
	if r1a == r2 {
		t.Fatalf("two servers share the random part %s", r2)
	}

	// The longest prefix still leaves room for the random part and a
	// 20-digit connection number within locksm.MaxOwnerLen.
	longest := locksm.MaxOwnerLen - 1 - 16 - 1 - 20
	for n, ok := range map[int]bool{longest: true, longest + 1: false} {
		cfg := unixapi.DefaultConfig()
		cfg.Path, cfg.OwnerPrefix = "/tmp/x.sock", strings.Repeat("o", n)
		if err := cfg.Validate(); (err == nil) != ok || err != nil && !errors.Is(err, unixapi.ErrInvalidConfig) {
			t.Errorf("OwnerPrefix of %d bytes: %v", n, err)
		}
	}
}
