package locksm

import (
	"fmt"
	"testing"
)

// The per-session bound on revoke notes (MaxSessionRevokes) forgets the
// oldest note of a live session silently: a broker away while an
// operator's mass revoke ends more than 1024 of its session's holdings
// resumes, is told the newest 1024, and never hears of the first one,
// though its ack never passed that note's AfterSerial. The broker
// believes it still holds the key until its own lease clock runs out
// (its fenced writes fail, but "a revoked holder is told" is broken).
// Nothing refuses the 1025th revoke or ends the session (which would
// tell the broker every holding is gone) instead of forgetting.
func TestAttack42d_PerSessionBoundForgetsOwedNote(t *testing.T) {
	s := New()
	applyOK(t, s, Command{Op: OpOpenSession, Session: 1, SecretHash: string(make([]byte, SecretHashLen)), TimeoutMs: 300_000, Now: 1}, StatusOpened)
	var first uint64
	now := int64(1_000)
	for i := range MaxSessionRevokes + 1 {
		res, _ := applyOK(t, s, Command{Op: OpAcquire, Key: fmt.Sprintf("k-%d", i), Owner: "b", LeaseSec: 250, Session: 1, Seq: uint64(i + 1), Now: now}, StatusGranted)
		if i == 0 {
			first = res.Token
		}
		now++
	}
	// The broker is away now (no ack beyond its grants' serials is ever
	// sent: its ack stays 0). The operator revokes every holding.
	for i := range MaxSessionRevokes {
		applyOK(t, s, Command{Op: OpRevoke, Key: fmt.Sprintf("k-%d", i), Owner: "ops", Token: first + uint64(i), Reason: "mass", Now: now}, StatusRevoked)
		now++
	}
	// The bound is reached: one more would forget a note still owed, so
	// it is refused, and nothing changes (the fix; it was applied and the
	// oldest note dropped).
	last := Command{Op: OpRevoke, Key: fmt.Sprintf("k-%d", MaxSessionRevokes), Owner: "ops", Token: first + MaxSessionRevokes, Reason: "mass", Now: now}
	if res, _ := s.Apply(last, nil); res.Status != StatusRejected || res.Err != ErrRevokesPending {
		t.Fatalf("the revoke past the bound: %+v, want rejected ErrRevokesPending", res)
	}
	if h, ok := s.Holder(last.Key); !ok || h.Token != last.Token {
		t.Fatalf("after the refused revoke, %s is held by %+v %v", last.Key, h, ok)
	}
	// Once the broker acks past them (an outcome recorded after them,
	// whose reply it read after their lost events), the notes go and the
	// revoke goes through.
	applyOK(t, s, Command{Op: OpAcquire, Key: "later", Owner: "b", LeaseSec: 250, Session: 1, Seq: MaxSessionRevokes + 2, Now: now}, StatusGranted)
	applyOK(t, s, Command{Op: OpAckSession, Session: 1, Ack: MaxSessionRevokes + 2, Now: now}, StatusAcked)
	applyOK(t, s, last, StatusRevoked)
	got := s.SessionRevokes(1)
	if len(got) == 1 && got[0].Token == last.Token {
		return
	}
	for _, n := range got {
		if n.Token == first {
			t.Fatalf("notes %d..: the acked ones were kept", len(got))
		}
	}
	t.Fatalf("session 1 (alive, ack 0) is owed the revoke of token %d, but the note was dropped by the per-session bound (%d notes kept, oldest token %d); its broker resumes and is never told, and the session lives on", first, len(got), got[0].Token)
}
