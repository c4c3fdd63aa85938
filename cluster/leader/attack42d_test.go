package leader

import (
	"fmt"
	"strings"
	"testing"
)

// Issue 42, fourth attack round: the per-session bound on revoke notes
// (locksm.MaxSessionRevokes, 1024) forgets the oldest note of a live
// session, whatever its ack. A broker holding more than 1024 locks
// through one session is cut off; the operator revokes them all (a mass
// revoke of a failed application); the broker resumes with every grant
// acked and is told 1024 X frames: never the one for token 1. Its ack
// never passed that note's AfterSerial, so the note was owed; the broker
// counts on k-0 until its lease clock runs out, while k-0 can be granted
// to the next caller.
func TestAttack42d_ResumeAfterMassRevokeOfOneSessionMissesX(t *testing.T) {
	h := newHarness(Config{MaxKeys: 4_000_000}) // the node's default
	var all strings.Builder
	run := func(l string) {
		t.Helper()
		got, err := h.run(l)
		if err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		all.WriteString(got)
	}
	for _, l := range []string{
		"gain", "serve",
		"open conn=b1 version=14", "open conn=op version=0",
		"open-session conn=b1 id=1 session=7 timeout=60000", "commit",
	} {
		run(l)
	}
	const n = 1025
	for i := range n {
		run(fmt.Sprintf("acquire conn=b1 id=%d key=k-%d owner=a lease=250", i+1, i))
		run("commit")
	}
	if c := strings.Count(all.String(), "send b1 G id="); c != n {
		t.Fatalf("setup: %d grants, want %d\n%s", c, n, all.String()[len(all.String())-1500:])
	}
	run(fmt.Sprintf("session-ack conn=b1 serial=%d", n)) // the broker read every G and O
	run("commit")
	run("close conn=b1")
	for i := range n {
		run(fmt.Sprintf(`revoke conn=op id=%d key=k-%d token=%d reason="mass"`, i+1, i, i+1))
		run("commit")
	}
	if c := strings.Count(all.String(), ": revoked token="); c != n {
		t.Logf("setup: %d revoked", c)
	}
	all.Reset()
	run("open conn=b2 version=14")
	run(fmt.Sprintf("resume conn=b2 id=%d session=7 high=%d ack=%d", n+1, n, n))
	run("commit")
	xs := 0
	for _, line := range strings.Split(all.String(), "\n") {
		if strings.HasPrefix(line, "send b2 X revoked") {
			xs++
			if strings.Contains(line, " token=1 ") || strings.HasSuffix(line, " token=1") {
				return
			}
		}
	}
	t.Fatalf("the resumed broker of session 7 (ack %d, every one of its %d holdings revoked while it was away) heard %d X frames, none for token 1: it still counts on k-0\n%s", n, n, xs, all.String()[:min(len(all.String()), 2000)])
}
