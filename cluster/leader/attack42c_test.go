package leader

import (
	"fmt"
	"strings"
	"testing"
)

// Issue 42, third attack round: a SessionRevoke note is pruned when a
// later revoke's Now (one leader's wall clock) passes the revoked
// holding's LeaseEnd (another leader's stamps) plus 60 s. A leader whose
// clock is ahead of the old one's by more than the lease and the slack
// (NTP step, VM resume, a misconfigured node: a Jepsen clock nemesis
// bumps clocks by minutes) prunes, with any revoke of another session's
// holding, the note a broker that was away is owed. The broker resumes
// and is replayed the G of its revoked holding with no X after it: it
// believes it holds k (lease 250 s by its own clock) while k can be
// granted to the next caller. The same with an acked G: no X at all.
//
// Sequence: L1 (clock right) grants k to session 7 (token 1, lease
// 250 s); the broker is cut off before it hears the G; the operator
// revokes token 1 (note, LeaseEnd = t0+250 s). L1 fails; F2, whose wall
// clock is 400 s ahead, wins; an operator revokes session 8's holding
// of j (stamp t0+400 s: note 1 pruned). Session 7's broker resumes on F2
// a few seconds after the revoke in real time.
func TestAttack42c_ResumeAfterSkewedLeaderPrunedTheNote(t *testing.T) {
	h := newHarness(Config{})
	var all strings.Builder
	for _, l := range []string{
		// F2 as a follower applies L1's entries (stamped with L1's clock: 0).
		"append term=1 op=open-session session=7 timeout=60000 ref=1",
		"append term=1 op=acquire key=k owner=a lease=250 session=7 seq=1 ref=2",
		`append term=1 op=revoke key=k token=1 owner=ops ref=3 reason="stuck"`,
		"commit",
		// F2's wall clock is 400 s ahead of L1's (modelled by the
		// harness clock: no time passes for anyone in reality).
		"advance ms=400000",
		"gain term=2", "serve",
		"open conn=c1 version=14", "open conn=op version=0",
		"open-session conn=c1 id=1 session=8", "commit",
		"acquire conn=c1 id=1 key=j owner=c lease=5", "commit",
		`revoke conn=op id=1 key=j token=2 reason="other"`, "commit",
		// Session 7's broker resumes.
		"open conn=b2 version=14",
		"resume conn=b2 id=1 session=7 high=0", "commit",
	} {
		got, err := h.run(l)
		if err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		all.WriteString(got)
	}
	wantXAfterG(t, all.String())
}

// Issue 42, third attack round: the SessionRevoke notes of all sessions
// share one FIFO of locksm.MaxSessionRevokes (1024). An operator's mass
// revoke (a script ending every lock of a failed application: 1024
// holdings of another session, within the victim's lease) pushes out the
// note owed to a live session whose broker was away; it resumes and is
// replayed the G of its revoked holding, with no X after it.
func TestAttack42c_ResumeAfterOtherRevokesEvictedTheNote(t *testing.T) {
	h := newHarness(Config{})
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
		"open conn=b1 version=14", "open conn=op version=0", "open conn=c1 version=14",
		"open-session conn=b1 id=1 session=7 timeout=60000", "commit",
		"open-session conn=c1 id=1 session=8 timeout=60000", "commit",
		"acquire conn=b1 id=1 key=k owner=a lease=250", "commit",
		"close conn=b1", // the G went out; the broker never read it
		`revoke conn=op id=1 key=k token=1 reason="stuck"`, "commit",
	} {
		run(l)
	}
	for i := range 1024 {
		run(fmt.Sprintf("acquire conn=c1 id=%d key=o%d owner=c lease=250", i+2, i))
		run("commit")
		run(fmt.Sprintf(`revoke conn=op id=%d key=o%d token=%d reason="mass"`, i+2, i, i+2))
		run("commit")
	}
	if n := strings.Count(all.String(), "applied revoke"); n < 1025 || strings.Count(all.String(), ": revoked token=") != 1025 {
		t.Logf("setup: %d revokes applied, %d revoked; tail:\n%s", n, strings.Count(all.String(), ": revoked token="), all.String()[max(0, len(all.String())-3000):])
	}
	all.Reset()
	run("open conn=b2 version=14")
	run("resume conn=b2 id=2 session=7 high=0")
	run("commit")
	wantXAfterG(t, all.String())
}

// wantXAfterG checks that broker b2, resumed (the output out), was told
// the G of token 1 and, after it, the lost event of its revoke.
func wantXAfterG(t *testing.T, out string) {
	t.Helper()
	var b2 []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "send b2 ") {
			b2 = append(b2, strings.TrimPrefix(line, "send b2 "))
		}
	}
	g, x := -1, -1
	for i, m := range b2 {
		if strings.HasPrefix(m, "G id=1 token=1") {
			g = i
		}
		if strings.HasPrefix(m, "X revoked key=k token=1") {
			x = i
		}
	}
	if g < 0 || x < g {
		t.Fatalf("the resumed broker of session 7 heard %q: G of token 1 at %d, its X at %d (want the X after the G)\n%s", b2, g, x, out)
	}
}
