package cluster_test

import (
	"context"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/wire"
)

// EXTEND and the lost event over real nodes: an extended lease outlives
// its first lease (the waiter keeps waiting), the leader tells the holder's
// connection X when it commits the expiry, the waiter then gets the key,
// an extend after the loss is refused, and the node counts it all.
func TestExtendAndLostOverRealNodes(t *testing.T) {
	c := startCluster(t, 3)
	li := c.leader()
	reg := c.Node(li).MetricsRegistry()

	type lost struct {
		ev wire.Msg
		at time.Time
	}
	lostc := make(chan lost, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	holder, err := client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID, TLS: c.ClientTLS,
		OnLost: func(_ *client.Conn, ev wire.Msg) { lostc <- lost{ev, time.Now()} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	if v := holder.Peer().Version; v < wire.VersionExtend {
		t.Fatalf("holder connection speaks version %d, want %d", v, wire.VersionExtend)
	}
	other := c.dial(li)

	tok := mustGrant(t, do(t, holder, acquireMsg("k", "a", 1, 0)))
	sent := time.Now()
	mustType(t, do(t, holder, wire.Msg{Type: wire.TypeExtend, Key: "k", Owner: "a", Token: tok, Lease: 3}), wire.TypeOK)

	// A waiter queues behind the extended holding.
	type reply struct {
		m   wire.Msg
		err error
	}
	waiter := make(chan reply, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, _, err := other.Do(ctx, acquireMsg("k", "b", 10, 20*time.Second))
		waiter <- reply{r, err}
	}()

	// Past the first lease the key is still held under the same token.
	time.Sleep(1500 * time.Millisecond)
	mustType(t, do(t, c.dial(li), acquireMsg("k", "c", 10, 0)), wire.TypeBusy)
	select {
	case l := <-lostc:
		t.Fatalf("lost event %+v before the extended lease ran out", l.ev)
	case r := <-waiter:
		t.Fatalf("waiter answered %s before the extended lease ran out", describe(r.m))
	default:
	}

	var l lost
	select {
	case l = <-lostc:
	case <-time.After(15 * time.Second):
		t.Fatal("no lost event after the extended lease ran out")
	}
	if l.ev.Type != wire.TypeLost || l.ev.Token != tok || l.ev.Key != "k" || l.ev.Reason != wire.LostExpired {
		t.Fatalf("lost event %+v, want token %d key k reason expired", l.ev, tok)
	}
	// The lease the leader renewed started after the extend was sent.
	if d := l.at.Sub(sent); d < 3*time.Second {
		t.Fatalf("lost event %v after the extend was sent, before its 3 s lease", d)
	}
	r := <-waiter
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := mustGrant(t, r.m); got <= tok {
		t.Fatalf("waiter's token %d not above the expired %d", got, tok)
	}

	m := do(t, holder, wire.Msg{Type: wire.TypeExtend, Key: "k", Owner: "a", Token: tok, Lease: 3})
	if m.Type != wire.TypeError || m.Code != wire.CodeNotHeld && m.Code != wire.CodeTokenMismatch {
		t.Fatalf("extend after the loss: %s, want not_held or token_mismatch", describe(m))
	}

	wantMetric(t, reg, 1, "ticketing_node_extends_total", "result", "ok")
	wantMetric(t, reg, 1, "ticketing_node_extends_total", "result", "not_held")
	wantMetric(t, reg, 1, "ticketing_node_lost_events_total")
	wantMetric(t, reg, 1, "ticketing_node_expiries_total")
}
