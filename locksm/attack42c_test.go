package locksm

import (
	"fmt"
	"testing"
)

// Issue 42, third attack round.
//
// A SessionRevoke note is pruned by comparing the revoked holding's
// LeaseEnd (stamped by the leader that granted/extended it) with the Now
// of a LATER revoke (stamped by whichever leader proposes that one). Two
// stamps of different leaders' wall clocks are compared: a leader whose
// clock is ahead (or one leader's clock stepping forward) prunes the
// note of a holding whose lease still runs by the broker's clock, so a
// broker that was away when its holding was revoked resumes and is never
// told (no LOST, while the key was handed on). Elsewhere the state machine
// refuses to compare stamps ("No time is compared (a leader's clock may
// jump)", extend).
func TestAttack42c_SessionRevokeNotePrunedByAnotherLeadersClock(t *testing.T) {
	s := New()
	open := func(id uint64) {
		applyOK(t, s, Command{Op: OpOpenSession, Session: id, SecretHash: string(make([]byte, SecretHashLen)), TimeoutMs: 300_000, Now: 1}, StatusOpened)
	}
	open(7)
	open(8)
	// Leader L1 (clock right): session 7's broker holds k for 250 s.
	applyOK(t, s, Command{Op: OpAcquire, Key: "k", Owner: "b", LeaseSec: 250, Session: 7, Seq: 1, Now: 1_000}, StatusGranted) // token 1
	// The broker is cut off; the operator revokes its holding a second later.
	applyOK(t, s, Command{Op: OpRevoke, Key: "k", Owner: "ops", Token: 1, Reason: "stuck", Now: 2_000}, StatusRevoked)
	if n := len(s.SessionRevokes(7)); n != 1 {
		t.Fatalf("setup: %d notes for session 7", n)
	}
	// Leadership moves to L2, whose wall clock is 10 minutes ahead. Real
	// time: a few seconds later. Session 8's holding is revoked there.
	skew := int64(600_000)
	applyOK(t, s, Command{Op: OpAcquire, Key: "j", Owner: "c", LeaseSec: 5, Session: 8, Seq: 1, Now: 3_000 + skew}, StatusGranted) // token 2
	applyOK(t, s, Command{Op: OpRevoke, Key: "j", Owner: "ops", Token: 2, Now: 4_000 + skew}, StatusRevoked)
	// Session 7's broker resumes (real time ~5 s: its holding's lease,
	// 250 s by its own clock, still runs): it must be told of token 1.
	if got := s.SessionRevokes(7); len(got) != 1 {
		t.Fatalf("session 7 (alive, its lease of 250 s granted ~4 s ago in real time) is owed the revoke of token 1, but the note was pruned by a later revoke stamped by a leader whose clock is %d ms ahead: %+v", skew, got)
	}
}

// The notes of all sessions share one FIFO of MaxSessionRevokes: revokes
// of other sessions' holdings (one operator scripting a mass revoke, or a
// busy cluster) push out the note of a live session whose holding's lease
// still runs, well inside lease+slack, so its broker, away when it was
// revoked, resumes and is never told. Nothing bounds the notes per
// session (or refuses a revoke rather than forget an owed one).
func TestAttack42c_SessionRevokeNoteEvictedByOtherSessions(t *testing.T) {
	s := New()
	open := func(id uint64) {
		applyOK(t, s, Command{Op: OpOpenSession, Session: id, SecretHash: string(make([]byte, SecretHashLen)), TimeoutMs: 300_000, Now: 1}, StatusOpened)
	}
	open(1)
	open(2)
	applyOK(t, s, Command{Op: OpAcquire, Key: "victim", Owner: "b", LeaseSec: 250, Session: 1, Seq: 1, Now: 1_000}, StatusGranted)
	applyOK(t, s, Command{Op: OpRevoke, Key: "victim", Owner: "ops", Token: 1, Reason: "x", Now: 1_001}, StatusRevoked)
	now := int64(2_000)
	for i := range MaxSessionRevokes {
		key := fmt.Sprintf("other-%d", i)
		res, _ := applyOK(t, s, Command{Op: OpAcquire, Key: key, Owner: "c", LeaseSec: 250, Session: 2, Seq: uint64(i + 1), Now: now}, StatusGranted)
		applyOK(t, s, Command{Op: OpRevoke, Key: key, Owner: "ops", Token: res.Token, Now: now + 1}, StatusRevoked)
		now += 2
	}
	// Real time: ~6 s after the victim's grant; its lease is 250 s.
	if got := s.SessionRevokes(1); len(got) != 1 {
		t.Fatalf("session 1's note of token 1 (lease to %d ms, now %d ms) evicted by %d revokes of another session's holdings: %+v", 251_000, now, MaxSessionRevokes, got)
	}
}
