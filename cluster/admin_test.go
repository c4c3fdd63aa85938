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
// ErrBadConfig keeps its own text for configuration errors: it answers
// bad_request, which a client gets back as wire.ErrBadRequest.
func TestAdminCodesMatchWire(t *testing.T) {
	for _, c := range []struct {
		err  error
		code string
		back error // the client's sentinel for code; nil: err itself
	}{
		{ErrNotLeader, wire.AdminNotLeader, nil},
		{ErrNoQuorum, wire.AdminNoQuorum, nil},
		{ErrUnsafeChange, wire.AdminUnsafe, nil},
		{ErrLearnerLagging, wire.AdminLagging, nil},
		{ErrChangeInProgress, wire.AdminInProgress, nil},
		{ErrNoSuchMember, wire.AdminNoSuchMember, nil},
		{ErrBadConfig, wire.AdminBadRequest, wire.ErrBadRequest},
	} {
		if got := wire.AdminCodeOf(fmt.Errorf("op: %w", c.err)); got != c.code {
			t.Errorf("wire.AdminCodeOf(%v) = %q, want %q", c.err, got, c.code)
		}
		want := c.back
		if want == nil {
			want = c.err
		}
		if back := wire.AdminErrOf(c.code); !errors.Is(back, want) {
			t.Errorf("wire.AdminErrOf(%q) = %v, which is not %v", c.code, back, want)
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
