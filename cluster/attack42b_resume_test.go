package cluster_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"ticketing/cluster/wire"
)

// Attack round 2 on issue 42: round 1's fix tells a resuming broker of
// its session's revoked holdings from the state's revoke records; but the
// state keeps one record per key (the key's LATEST revoke, at most 1024
// keys). A second revoke of the same key (the next holder is stuck too,
// an operator clearing a line), or of a block sharing one of its keys,
// or 1024 revokes of other keys, replaces the record before the broker
// resumes: the resume replays G with the revoked token and no X follows.
// Round 1's finding 1 again: the broker hands its application a revoked
// lock, as valid for most of its lease.
//
// Sequence: as TestAttack42_RevokedUntoldSessionGrantReplayedOnResume,
// plus: after the revoke of the session's token tS hands "hot" to next
// (tN), the operator revokes tN too; then the broker resumes.
func TestAttack42b_SecondRevokeOfKeyErasesSessionsLostEvent(t *testing.T) {
	c, li := a42Start(t)
	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	const sid = 4242
	const attach = 1 << 40
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tS, tN, ack := a42UntoldRevoked(t, c, li, ctx, sid, attach, secret)
	// The next holder is stuck too: the operator revokes it as well. The
	// key's audit record (one per key) is now tN's: the record that named
	// the session's revoked holding, the only thing a resume tells from,
	// is gone.
	if _, err := c.admin().Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "hot", Token: tN, By: "ops", Reason: "stuck too"}); err != nil {
		t.Fatalf("second revoke: %v", err)
	}

	// The broker resumes.
	grantedRevoked, lostTold := a42ResumeSees(t, c, li, sid, attach, secret, ack, tS)
	if grantedRevoked && !lostTold {
		t.Fatalf("the resumed broker was told G token %d, which the operator revoked (handed to %d, revoked in turn: hot is free for anyone), and never told it is lost: its application holds a revoked lock for most of its lease", tS, tN)
	}
	if !lostTold {
		t.Fatalf("the revoked session holder (token %d) was never told of the revoke", tS)
	}
}
