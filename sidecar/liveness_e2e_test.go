// End-to-end tests of a session's liveness by heartbeat (docs/sessions.md,
// "Liveness"): the broker pings its session connection at a third of the
// session timeout, and the leader takes a session connection silent for
// the timeout for dead, against real nodes whose IdleTimeout (2 min) is
// far longer than anything these tests wait for.
package sidecar

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/netfault"
	"ticketing/cluster/testkit"
	"ticketing/locksm"
)

// livenessTimeout is the session timeout of the silent-connection test:
// short, so that its detach and expiry fit in a test, twice the shortest
// the cluster takes. (What it asserts has no upper bound in time; the idle
// test, which must not see a healthy connection closed, uses the default.)
const livenessTimeout = 2 * time.Duration(locksm.MinSessionTimeoutMs) * time.Millisecond

// startIdleCluster starts three real nodes (version 7) whose IdleTimeout
// is 2 min: a connection these tests see closed sooner was closed by its
// session's bound.
func startIdleCluster(t *testing.T) *local.Cluster {
	t.Helper()
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: testLogger(), Tune: func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		cfg.IdleTimeout = 2 * time.Minute
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sessionReport is the leader's report of session id (false: none).
func sessionReport(c *local.Cluster, li int, id uint64) (attached, ok bool) {
	for _, sr := range c.Node(li).StatusReport().Sessions {
		if sr.ID == fmt.Sprintf("%x", id) {
			return sr.Attached != nil && *sr.Attached, true
		}
	}
	return false, false
}

// A broker whose host is lost (its connections go silent without closing:
// every frame both ways is held from some point on) loses its session
// after about two session timeouts, not the node's IdleTimeout: the leader
// closes the silent connection after one timeout (detaching the session),
// and expires the session after one more. Its waiter leaves the line, and
// another broker's waiter behind it gets the key.
func TestE2ESessionSilentConnectionIsDetachedAndExpired(t *testing.T) {
	c := startIdleCluster(t)
	var frozen atomic.Bool
	f := netfault.NewFrames(func(netfault.Frame) netfault.Verdict {
		if frozen.Load() {
			return netfault.Hold
		}
		return netfault.Pass
	})
	lost := newBroker(t, c, func(cfg *Config) { cfg.Dialer = f.Dial; cfg.SessionTimeout = livenessTimeout })
	t.Cleanup(func() { frozen.Store(false); f.Release() }) // before the brokers close
	other := newBroker(t, c, nil)
	for _, b := range []*Broker{lost, other} {
		testkit.WaitFor(t, "the cluster session attached", 20*time.Second, func() bool {
			si := b.Info().Session
			return si != nil && si.State == "attached"
		})
	}
	sid := lost.Info().Session.ID
	li := leaderOf(t, c)
	ctx := ctxT(t, 90*time.Second)
	held, err := other.Acquire(ctx, "k", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The lost broker's waiter first, the other's behind it; both wait
	// for 60 s, half the IdleTimeout.
	lostWaiter := asyncAcquire(t, lost, ctx, "k", 60*time.Second)
	testkit.WaitFor(t, "the lost broker's waiter queued", 10*time.Second, func() bool { return waiting(c, li) == 1 })
	otherWaiter := asyncAcquire(t, other, ctx, "k", 60*time.Second)
	testkit.WaitFor(t, "the other waiter queued", 10*time.Second, func() bool { return waiting(c, li) == 2 })

	frozen.Store(true)
	froze := time.Now()
	// Hang guards of 60 s: the IdleTimeout (2 min) cannot act within them.
	testkit.WaitFor(t, "the silent session detached", 60*time.Second, func() bool {
		attached, ok := sessionReport(c, li, sid)
		return !ok || !attached
	})
	detached := time.Since(froze)
	testkit.WaitFor(t, "the silent session expired", 60*time.Second, func() bool {
		_, ok := sessionReport(c, li, sid)
		return !ok
	})
	expired := time.Since(froze)
	t.Logf("silent session detached after %v, expired after %v (timeout %v, IdleTimeout 2m)", detached, expired, livenessTimeout)
	var ws []locksm.Waiter
	c.Node(li).ReadState(func(st *locksm.State) { ws = st.Waiters("k") })
	if len(ws) != 1 || ws[0].Session == sid {
		t.Fatalf("line after the expiry: %+v, want only the other broker's waiter", ws)
	}
	if err := other.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	r := result(t, otherWaiter)
	if r.err != nil || r.lk.Token <= held.Token {
		t.Fatalf("the waiter behind the lost session's: %+v %v, want the key", r.lk, r.err)
	}
	if h, ok := holder(c, li, "k"); !ok || h.Token != r.lk.Token {
		t.Fatalf("holder %+v %v, want token %d", h, ok, r.lk.Token)
	}
	frozen.Store(false)
	f.Release()
	if r := result(t, lostWaiter); r.err == nil {
		t.Fatalf("the lost broker's waiter was granted %+v after its session expired", r.lk)
	}
}

// A healthy session connection that carries nothing for several session
// timeouts is not closed: the broker's pings keep it alive, so the session
// is never detached and never resumed. It runs with the default timeout
// (10 s, pings every 3.3 s): with the 4 s one, a stall of about 2.7 s of a
// starved CI machine would close a healthy connection (harmless for the
// product, which resumes, but this test counts resumes).
func TestE2ESessionIdleConnectionStaysAttached(t *testing.T) {
	c := startIdleCluster(t)
	const timeout = DefaultSessionTimeout
	b := newBroker(t, c, func(cfg *Config) { cfg.SessionTimeout = timeout })
	testkit.WaitFor(t, "the cluster session attached", 20*time.Second, func() bool {
		si := b.Info().Session
		return si != nil && si.State == "attached"
	})
	ctx := ctxT(t, 2*time.Minute)
	lk, err := b.Acquire(ctx, "k", "holder", 90*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	li := leaderOf(t, c)
	sid := b.Info().Session.ID
	for range 3 {
		time.Sleep(timeout)
		if attached, ok := sessionReport(c, li, sid); !ok || !attached {
			t.Fatalf("quiet session: leader reports attached=%v known=%v", attached, ok)
		}
	}
	si := b.Info().Session
	if si.State != "attached" || si.Resumes != 0 || si.Opens != 1 {
		t.Fatalf("after 3 quiet timeouts: %+v, want attached, never resumed or reopened", si)
	}
	if h, ok := holder(c, li, "k"); !ok || h.Token != lk.Token {
		t.Fatalf("holder %+v %v, want token %d", h, ok, lk.Token)
	}
	if err := b.Release(ctx, lk); err != nil {
		t.Fatalf("release on the quiet connection: %v", err)
	}
}
