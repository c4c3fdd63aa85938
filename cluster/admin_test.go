package cluster

import (
	"errors"
	"fmt"
	"testing"

	"ticketing/cluster/wire"
)

// This package's membership sentinels are the admin codes' (cluster/wire
// owns the table, TestAdminCodeTable there): each answers its code, also
// wrapped, and the sentinel a client gets back for the code matches this
// package's name, so errors.Is works with either spelling on both sides.
func TestAdminCodesMatchWire(t *testing.T) {
	for _, c := range []struct {
		err  error
		code string
	}{
		{ErrNotLeader, wire.AdminNotLeader},
		{ErrNoQuorum, wire.AdminNoQuorum},
		{ErrUnsafeChange, wire.AdminUnsafe},
		{ErrLearnerLagging, wire.AdminLagging},
		{ErrChangeInProgress, wire.AdminInProgress},
		{ErrNoSuchMember, wire.AdminNoSuchMember},
		{ErrBadConfig, wire.AdminBadRequest},
	} {
		if got := wire.AdminCodeOf(fmt.Errorf("op: %w", c.err)); got != c.code {
			t.Errorf("wire.AdminCodeOf(%v) = %q, want %q", c.err, got, c.code)
		}
		if back := wire.AdminErrOf(c.code); !errors.Is(back, c.err) {
			t.Errorf("wire.AdminErrOf(%q) = %v, which is not %v", c.code, back, c.err)
		}
	}
	if got := wire.AdminCodeOf(fmt.Errorf("%w: %w", ErrUnsafeChange, ErrNoQuorum)); got != wire.AdminNoQuorum {
		t.Errorf("a refusal for want of a quorum answers %q, want %q", got, wire.AdminNoQuorum)
	}
	// The node's other sentinels answer internal, as they always did.
	for _, err := range []error{ErrVoterCount, ErrIdentity, ErrClusterExists, ErrClosing, ErrHandOverInProgress, ErrNoTarget} {
		if got := wire.AdminCodeOf(err); got != wire.AdminInternal {
			t.Errorf("wire.AdminCodeOf(%v) = %q, want internal", err, got)
		}
	}
}
