package sidecar

import (
	"fmt"
	"strings"
	"testing"
)

// The scheduler's rules, on its own (no connection, no clock): the order
// acquires are sent in, and who gets or loses waiter room.

func newOp(sc *sched, owner, key string, waiter bool) *acqOp {
	o := &acqOp{key: key, owner: owner, waiter: waiter}
	o.sess = sc.session(owner)
	return o
}

// sendOrder drains the scheduler and lists "owner:key" in sending order.
func sendOrder(sc *sched) string {
	var out []string
	for o := sc.next(); o != nil; o = sc.next() {
		out = append(out, o.owner+":"+o.key)
	}
	return strings.Join(out, " ")
}

// A flood of one session does not hold back the others: sending takes
// turns across sessions, and each session's acquires keep their order.
func TestSchedRoundRobinKeepsSessionFIFO(t *testing.T) {
	sc := newSched(100, 100)
	for i := range 5 {
		sc.enqueue(newOp(sc, "flood", fmt.Sprint(i), false))
	}
	sc.enqueue(newOp(sc, "b", "0", false))
	sc.enqueue(newOp(sc, "c", "0", false))
	sc.enqueue(newOp(sc, "b", "1", false))
	if got, want := sendOrder(sc), "flood:0 b:0 c:0 flood:1 b:1 flood:2 flood:3 flood:4"; got != want {
		t.Fatalf("send order\n got %s\nwant %s", got, want)
	}
	if sc.pendingN != 0 || sc.ring != nil {
		t.Fatalf("pending %d ring %v after draining", sc.pendingN, sc.ring)
	}
}

// An acquire taken but not sent (its connection refused it) goes back to
// the head of its session, so the session's order is kept.
func TestSchedRequeueKeepsOrder(t *testing.T) {
	sc := newSched(100, 100)
	for i := range 3 {
		sc.enqueue(newOp(sc, "a", fmt.Sprint(i), false))
	}
	sc.enqueue(newOp(sc, "b", "0", false))
	o := sc.next() // a:0
	sc.requeue(o)
	if got, want := sendOrder(sc), "b:0 a:0 a:1 a:2"; got != want {
		t.Fatalf("after a requeue: %s, want %s", got, want)
	}
	// Taking one out of the middle (cancelled) leaves the rest in order.
	x, y, z := newOp(sc, "a", "x", false), newOp(sc, "a", "y", false), newOp(sc, "a", "z", false)
	sc.enqueue(x)
	sc.enqueue(y)
	sc.enqueue(z)
	sc.unqueue(y)
	if got := sendOrder(sc); got != "a:x a:z" {
		t.Fatalf("after unqueue: %s", got)
	}
}

// wait-0 acquires need no room; acquires with a wait take one unit each,
// up to the per-session limit.
func TestSchedRoomAndPerSessionLimit(t *testing.T) {
	sc := newSched(10, 3)
	for range 5 {
		if v, _ := sc.admit(newOp(sc, "a", "free", false)); v != admitted {
			t.Fatalf("wait-0: %v", v)
		}
	}
	for i := range 3 {
		if v, _ := sc.admit(newOp(sc, "a", "hot", true)); v != admitted {
			t.Fatalf("waiter %d: %v", i, v)
		}
	}
	if v, _ := sc.admit(newOp(sc, "a", "hot", true)); v != refusedSession {
		t.Fatalf("past the per-session limit: %v", v)
	}
	if v, _ := sc.admit(newOp(sc, "a", "free", false)); v != admitted {
		t.Fatalf("wait-0 past the waiter limit: %v", v)
	}
	if sc.waiters != 3 {
		t.Fatalf("%d waiters", sc.waiters)
	}
}

// When the room is full, the session holding the most is refused, and a
// session holding less evicts that session's newest waiter and gets its
// room when it frees; equal holders are refused.
func TestSchedFullRoomEvictsTheLargest(t *testing.T) {
	sc := newSched(4, 100)
	var flood []*acqOp
	for range 3 {
		o := newOp(sc, "flood", "hot", true)
		if v, _ := sc.admit(o); v != admitted {
			t.Fatal(v)
		}
		flood = append(flood, o)
	}
	b1 := newOp(sc, "b", "hot", true)
	if v, _ := sc.admit(b1); v != admitted {
		t.Fatal(v)
	}
	// Full (4). The flood asks for more: it holds the most, refused.
	if v, victim := sc.admit(newOp(sc, "flood", "hot", true)); v != refusedFull || victim != nil {
		t.Fatalf("largest session asking: %v %v", v, victim)
	}
	// A newcomer holding nothing: the flood's newest waiter is evicted.
	c1 := newOp(sc, "c", "hot", true)
	v, victim := sc.admit(c1)
	if v != mustWait || victim != flood[2] || !victim.evicting {
		t.Fatalf("newcomer: %v, victim %+v", v, victim)
	}
	// A second newcomer: the flood still holds the most (2 not being
	// evicted, against c's promised 1): its next newest goes.
	d1 := newOp(sc, "d", "hot", true)
	if v, victim := sc.admit(d1); v != mustWait || victim != flood[1] {
		t.Fatalf("second newcomer: %v, victim %v", v, victim)
	}
	// b holds 1 like the flood now: b is refused, nothing evicted.
	if v, victim := sc.admit(newOp(sc, "b", "hot", true)); v != refusedFull || victim != nil {
		t.Fatalf("equal holder: %v %v", v, victim)
	}
	// The evicted waiters' final replies free their room, in admitQ order.
	if in := sc.free(flood[2]); len(in) != 1 || in[0] != c1 || !c1.hasRoom || c1.admitting {
		t.Fatalf("first free admitted %v", in)
	}
	if in := sc.free(flood[1]); len(in) != 1 || in[0] != d1 {
		t.Fatalf("second free admitted %v", in)
	}
	if sc.waiters != 4 || sc.evicting != 0 || sc.admitQ.n != 0 {
		t.Fatalf("waiters %d evicting %d admitQ %d", sc.waiters, sc.evicting, sc.admitQ.n)
	}
	for _, s := range []string{"flood", "b", "c", "d"} {
		if n := sc.sessions[s].count(); n != 1 {
			t.Fatalf("session %s holds %d, want the equal share 1", s, n)
		}
	}
}

// Room freed by an ordinary end (not an eviction) goes to the first in
// admitQ too; an eviction under way whose room nobody claimed serves the
// next asker without another eviction.
func TestSchedUnclaimedEvictionServesNextAsker(t *testing.T) {
	sc := newSched(2, 100)
	a1, a2 := newOp(sc, "a", "k", true), newOp(sc, "a", "k", true)
	sc.admit(a1)
	sc.admit(a2)
	b1 := newOp(sc, "b", "k", true)
	if v, victim := sc.admit(b1); v != mustWait || victim != a2 {
		t.Fatalf("%v %v", v, victim)
	}
	// a1 ends on its own first: its room goes to b1.
	if in := sc.free(a1); len(in) != 1 || in[0] != b1 {
		t.Fatalf("admitted %v", in)
	}
	// a2's eviction is still under way and unclaimed: c gets its room
	// without evicting anyone.
	c1 := newOp(sc, "c", "k", true)
	if v, victim := sc.admit(c1); v != mustWait || victim != nil {
		t.Fatalf("%v %v", v, victim)
	}
	if in := sc.free(a2); len(in) != 1 || in[0] != c1 {
		t.Fatalf("admitted %v", in)
	}
	// A waiter that gives up while waiting for room leaves the line.
	d1 := newOp(sc, "d", "k", true)
	if v, victim := sc.admit(d1); v != mustWait || victim == nil {
		t.Fatalf("%v %v", v, victim)
	}
	sc.unwait(d1)
	if sc.admitQ.n != 0 || sc.sessions["d"].count() != 0 {
		t.Fatalf("admitQ %d", sc.admitQ.n)
	}
}
