package cluster

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"ticketing/cluster/wire"
)

// Every admin reply code of cluster/wire but "internal" has its sentinel
// here, each sentinel maps back to its code (also wrapped, and wrapped
// with the sentinels a refusal may carry besides), and nothing maps to a
// code wire does not list.
func TestAdminCodesMatchWire(t *testing.T) {
	for _, code := range wire.AdminCodes {
		err := AdminErrOf(code)
		if code == wire.AdminInternal {
			if err != nil {
				t.Errorf("AdminErrOf(%q) = %v, want nil", code, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("admin code %q has no sentinel", code)
			continue
		}
		if got := AdminCodeOf(fmt.Errorf("op: %w", err)); got != code {
			t.Errorf("AdminCodeOf(%v) = %q, want %q", err, got, code)
		}
	}
	for _, c := range adminCodes {
		if !slices.Contains(wire.AdminCodes, c.code) {
			t.Errorf("%v maps to %q, which wire.AdminCodes does not list", c.err, c.code)
		}
	}
	if got := AdminCodeOf(fmt.Errorf("%w: %w", ErrUnsafeChange, ErrNoQuorum)); got != wire.AdminNoQuorum {
		t.Errorf("a refusal for want of a quorum answers %q, want %q", got, wire.AdminNoQuorum)
	}
	if got := AdminCodeOf(errors.New("disk on fire")); got != wire.AdminInternal {
		t.Errorf("an unknown error answers %q, want internal", got)
	}
}
