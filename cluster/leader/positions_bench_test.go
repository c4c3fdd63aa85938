package leader

import (
	"testing"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// positionsRoom is a core leading with positions on, a holder of "room"
// and n waiters behind it on one version 12 connection that asked for
// places, every one of
// them told its place once. step hands the key on (the holder releases,
// the head takes it) and a newcomer joins the tail, so the line keeps n
// waiters and every place changes; walk runs the walk that tells them.
type positionsRoom struct {
	st    *locksm.State
	k     *Core[int]
	now   time.Time
	id    uint64
	token uint64
	owner string
	batch []Applied
}

func newPositionsRoom(tb testing.TB, n int) *positionsRoom {
	st := locksm.New()
	k := New[int](defaultConfig(Config{MaxInFlightPerConn: 1 << 20, MaxKeys: 1 << 20, MaxWaitersPerKey: 1 << 20,
		MaxWaitersPerConn: 1 << 20, PositionInterval: time.Second}), stateTable{s: st}, &directory{})
	r := &positionsRoom{st: st, k: k, now: time.Now()}
	k.GainLeadership(1)
	_, epoch := k.Leading()
	k.Serve(r.now, r.now.UnixMilli(), epoch)
	k.Open(1, wire.VersionPositions)
	r.request(&wire.Msg{Type: wire.TypeWatchPositions})
	k.Advance()
	r.request(&wire.Msg{Type: wire.TypeAcquire, Key: "room", Owner: "h", Lease: 250})
	for range n {
		r.request(&wire.Msg{Type: wire.TypeAcquire, Key: "room", Owner: "w", Lease: 250, WaitMs: 3_600_000})
	}
	r.apply()
	if st.QueueLen("room") != n {
		tb.Fatalf("%d waiters, want %d", st.QueueLen("room"), n)
	}
	h, _ := st.Holder("room")
	r.token, r.owner = h.Token, h.Owner
	if sent := r.walk(); sent != n {
		tb.Fatalf("the first walk told %d places, want %d", sent, n)
	}
	return r
}

func (r *positionsRoom) request(m *wire.Msg) {
	r.id++
	m.ID = r.id
	r.k.Request(r.now, 1, m)
}

// apply applies what the core proposed, as one batch, and drops the
// outputs.
func (r *positionsRoom) apply() {
	r.batch = r.batch[:0]
	for _, c := range r.k.Ready().Proposals {
		c.Now = r.now.UnixMilli()
		res, eff := r.st.Apply(c, nil)
		r.batch = append(r.batch, Applied{Cmd: c, Res: res, Effects: eff})
	}
	r.k.Advance()
	r.k.Applied(r.now, r.batch)
	r.k.Advance()
}

// step: the holder releases (the head is handed the key: the new holder),
// and a newcomer joins the tail. Every place changes.
func (r *positionsRoom) step() {
	r.now = r.now.Add(100 * time.Millisecond)
	r.request(&wire.Msg{Type: wire.TypeRelease, Key: "room", Owner: r.owner, Token: r.token})
	r.request(&wire.Msg{Type: wire.TypeAcquire, Key: "room", Owner: "w", Lease: 250, WaitMs: 3_600_000})
	r.apply()
	h, _ := r.st.Holder("room")
	r.token, r.owner = h.Token, h.Owner
}

// walk runs the positions walk and returns the R frames it queued.
func (r *positionsRoom) walk() int {
	r.k.TimerDue(Timer{Kind: TimerPositions, Epoch: r.k.epoch})
	n := 0
	for _, s := range r.k.Ready().Sends {
		if s.Msg.Type == wire.TypePosition {
			n++
		}
	}
	r.k.Advance()
	return n
}

// BenchmarkPositionWalk is one walk of a line of 100,000 waiters on one
// key whose every place changed (a hand-off, a newcomer at the tail):
// what the leader spends per interval on the busiest line there can be
// (MaxWaitersPerKey), reported per waiter told. Run with
// go test -bench PositionWalk -run XXX ./cluster/leader.
func BenchmarkPositionWalk(b *testing.B) {
	const n = 100_000
	r := newPositionsRoom(b, n)
	b.ReportAllocs()
	b.ResetTimer()
	var walked time.Duration
	for range b.N {
		b.StopTimer()
		r.step()
		b.StartTimer()
		start := time.Now()
		if sent := r.walk(); sent != n {
			b.Fatalf("the walk told %d places, want %d", sent, n)
		}
		walked += time.Since(start)
	}
	b.ReportMetric(float64(walked.Nanoseconds())/float64(b.N)/n, "ns/waiter")
}

// A line that did not move is not walked: a due walk with no marked key
// tells nobody, and a hand-off tells every waiter behind it once, at the
// next walk, however many hand-offs came before it.
func TestPositionWalkOncePerInterval(t *testing.T) {
	r := newPositionsRoom(t, 1000)
	if sent := r.walk(); sent != 0 {
		t.Fatalf("a walk of a line that did not move told %d", sent)
	}
	r.step()
	r.step()
	r.step()
	if sent := r.walk(); sent != 1000 {
		// Three hand-offs and three newcomers: 997 of the first 1000 and
		// three newcomers wait, each told once (the newcomers their first
		// place); the three granted meanwhile are told nothing.
		t.Fatalf("one walk after three hand-offs told %d places, want %d", sent, 1000)
	}
}

// countingTable counts the walks of whole lines.
type countingTable struct {
	stateTable
	walks *int
}

func (t countingTable) RangeWaiters(key string, fn func(*locksm.Waiter) bool) {
	*t.walks++
	t.stateTable.RangeWaiters(key, fn)
}

// A line that only grew since the last walk is not walked: its newcomers
// are told their places (at its tail) from its length alone, so a
// waiting room filling up costs the walk its joins, not its length. Any
// departure makes the next walk read the whole line again.
func TestPositionWalkOfAGrowingLine(t *testing.T) {
	r := newPositionsRoom(t, 1000)
	walks := 0
	r.k.table = countingTable{stateTable{s: r.st}, &walks}
	for range 5 {
		r.request(&wire.Msg{Type: wire.TypeAcquire, Key: "room", Owner: "w", Lease: 250, WaitMs: 3_600_000})
	}
	r.apply()
	r.k.TimerDue(Timer{Kind: TimerPositions, Epoch: r.k.epoch})
	var places []uint32
	for _, s := range r.k.Ready().Sends {
		if s.Msg.Type == wire.TypePosition {
			places = append(places, s.Msg.Position)
		}
	}
	r.k.Advance()
	if walks != 0 || len(places) != 5 || places[0] != 1001 || places[4] != 1005 {
		t.Fatalf("after 5 joins: %d walks of the line, places told %v; want none, 1001..1005", walks, places)
	}
	r.step() // a hand-off: every place moves
	if sent := r.walk(); walks != 1 || sent != 1000+5 {
		t.Fatalf("after a hand-off: %d walks, %d places told; want 1, %d", walks, sent, 1005)
	}
}
