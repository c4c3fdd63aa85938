package leader

import (
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
	k.GainLeadership()
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
