package leader

import (
	"strconv"
	"testing"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// BenchmarkAcquireReleaseCycle is one uncontended acquire+release cycle
// through the core alone: request, apply, reply, for both (the table is
// a locksm.State, outputs are dropped). It shows what the core adds to
// a cycle; the whole path is cluster's BenchmarkAcquireRelease64.
func BenchmarkAcquireReleaseCycle(b *testing.B) {
	st := locksm.New()
	k := New[int](defaultConfig(Config{}), stateTable{s: st}, &directory{})
	k.GainLeadership(1)
	_, epoch := k.Leading()
	k.Serve(time.Now(), time.Now().UnixMilli(), epoch)
	k.Open(1, wire.VersionNotices)
	k.Advance()
	now := time.Now()
	batch := make([]Applied, 1)
	apply := func() uint64 {
		rd := k.Ready()
		c := rd.Proposals[0]
		res, eff := st.Apply(c, nil)
		k.Advance()
		batch[0] = Applied{Cmd: c, Res: res, Effects: eff}
		k.Applied(now, batch)
		tok := k.Ready().Sends[0].Msg.Token
		k.Advance()
		return tok
	}
	acq := wire.Msg{Type: wire.TypeAcquire, ID: 1, Key: "bench/1", Owner: "bench", Lease: 30}
	rel := wire.Msg{Type: wire.TypeRelease, ID: 2, Key: "bench/1", Owner: "bench"}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k.Request(now, 1, &acq)
		rel.Token = apply()
		k.Request(now, 1, &rel)
		apply()
	}
}

// BenchmarkAppliedManySessions applies one batch holding one acquire of
// each of n sessions, each attached to its own connection: the core's
// per-batch session bookkeeping (the O watermarks it owes, the grants it
// must note) for a batch that touches n sessions.
func BenchmarkAppliedManySessions(b *testing.B) {
	for _, n := range []int{64, 1024, 4096} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			st := locksm.New()
			k := New[int](defaultConfig(Config{MaxInFlightPerConn: 8, MaxKeys: 1 << 20}), stateTable{s: st}, &directory{})
			k.GainLeadership(1)
			_, epoch := k.Leading()
			now := time.Now()
			k.Serve(now, now.UnixMilli(), epoch)
			var cmds []locksm.Command
			for i := range n {
				k.Open(i, wire.VersionSessions)
				var secret [wire.SecretLen]byte
				k.Request(now, i, &wire.Msg{Type: wire.TypeOpenSession, ID: 1 << 40, Session: uint64(i + 1), TimeoutMs: 10000, Secret: secret})
			}
			var opens []Applied
			for _, c := range k.Ready().Proposals {
				res, eff := st.Apply(c, nil)
				opens = append(opens, Applied{Cmd: c, Res: res, Effects: eff})
			}
			k.Advance()
			k.Applied(now, opens)
			k.Advance()
			batch := make([]Applied, n)
			seq := uint64(0)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				seq++
				for i := range n {
					k.Request(now, i, &wire.Msg{Type: wire.TypeAcquire, ID: seq, Key: "k" + strconv.Itoa(i%64), Owner: "o", Lease: 30})
				}
				cmds = append(cmds[:0], k.Ready().Proposals...)
				k.Advance()
				for i, c := range cmds {
					res, eff := st.Apply(c, nil)
					batch[i] = Applied{Cmd: c, Res: res, Effects: eff}
				}
				b.StartTimer()
				k.Applied(now, batch)
				b.StopTimer()
				k.Advance()
				b.StartTimer()
			}
		})
	}
}

// TestAcquireReleaseCycleAllocations pins what the core allocates for an
// uncontended acquire and release: the pending record of each request,
// nothing else. A command passed to the Table by pointer escaped to the
// heap on every request (issue 39's MatchesHolding took a *Command: two
// more allocations and 384 more bytes a cycle).
func TestAcquireReleaseCycleAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates (make test-norace runs this without it)")
	}
	st := locksm.New()
	k := New[int](defaultConfig(Config{}), stateTable{s: st}, &directory{})
	k.GainLeadership(1)
	_, epoch := k.Leading()
	now := time.Now()
	k.Serve(now, now.UnixMilli(), epoch)
	k.Open(1, wire.ProtocolVersion)
	k.Advance()
	batch := make([]Applied, 1)
	var eff []locksm.Effect
	apply := func() uint64 {
		c := k.Ready().Proposals[0]
		var res locksm.Result
		res, eff = st.Apply(c, eff[:0])
		k.Advance()
		batch[0] = Applied{Cmd: c, Res: res, Effects: eff}
		k.Applied(now, batch)
		tok := k.Ready().Sends[0].Msg.Token
		k.Advance()
		return tok
	}
	acq := wire.Msg{Type: wire.TypeAcquire, ID: 1, Key: "bench/1", Owner: "bench", Lease: 30}
	rel := wire.Msg{Type: wire.TypeRelease, ID: 2, Key: "bench/1", Owner: "bench"}
	ext := wire.Msg{Type: wire.TypeExtend, ID: 3, Key: "bench/1", Owner: "bench", Lease: 30}
	cycle := func() {
		k.Request(now, 1, &acq)
		tok := apply()
		ext.Token = tok
		k.Request(now, 1, &ext)
		apply()
		rel.Token = tok
		k.Request(now, 1, &rel)
		apply()
	}
	for range 100 {
		cycle()
	}
	if a := testing.AllocsPerRun(1000, cycle); a > 3 {
		t.Fatalf("%v allocations per acquire+extend+release through the core, want at most 3 (one pending record per request)", a)
	}
}
