package cluster_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/wire"
)

// Issue 39, finding 7, over real nodes: a client with the client secret
// that keeps EXTENDs of another's token (under a wrong owner) in flight at
// the leader all the time must not hold that token's expiry off. The old
// leader deferred a due expiry while any extend of the token was in
// flight and decided it when the last settled. A flood paced by its
// sender leaves gaps on real nodes (the leader applies each clump before
// the next arrives), and so does one the leader can take in whole (two
// batches of locksm.MaxBatch apply at once), so this one keeps floodConns
// × floodWindow requests unanswered, the next sent as each reply comes:
// some are always proposed or queued behind whatever the leader applies.
// On 3bb9d25 the key stayed held for the whole flood in 7 runs of 8 (10
// or 15 s; the eighth, under -race, found a gap after 6.5 s, so the test
// catches the old leader most of the time, not always); now the expiry
// hands it to the waiter about when the lease ends (1.1–1.4 s into the
// flood under -race, two runs at once on 2 cores). The bound is generous
// (the lease is 1 s, the flood lasts floodFor) and nothing else is timed.
func TestStrayExtendsDoNotHoldOffExpiry(t *testing.T) {
	const (
		floodConns  = 32
		floodWindow = 2048 // half the node's 4,096 in flight per connection
		floodFor    = 10 * time.Second
	)
	c := startCluster(t, 3)
	li := c.leader()
	tok := mustGrant(t, do(t, c.dial(li), acquireMsg("k", "a", 1, 0)))

	type reply struct {
		m   wire.Msg
		err error
		at  time.Time
	}
	waiter := make(chan reply, 1)
	wconn := c.dial(li)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), floodFor+30*time.Second)
		defer cancel()
		r, _, err := wconn.Do(ctx, acquireMsg("k", "b", 10, floodFor+20*time.Second))
		waiter <- reply{r, err, time.Now()}
	}()

	conns := make([]*client.Conn, floodConns)
	for i := range conns {
		conns[i] = c.dial(li)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var mu sync.Mutex
	var sent, answered, ok int
	var wg sync.WaitGroup
	for _, conn := range conns {
		sem := make(chan struct{}, floodWindow)
		hooks := client.Hooks{Done: func(call *client.Call) {
			<-sem
			mu.Lock()
			defer mu.Unlock()
			if call.Err == nil {
				answered++
				if call.Reply.Type == wire.TypeOK {
					ok++
				}
			}
		}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				if _, err := conn.StartFunc(wire.Msg{Type: wire.TypeExtend, Key: "k", Owner: "x", Token: tok, Lease: 30}, hooks); err != nil {
					<-sem
					t.Errorf("extend not sent: %v", err)
					return
				}
				mu.Lock()
				sent++
				mu.Unlock()
			}
		}()
	}
	floodStart := time.Now()
	var w reply
	select {
	case w = <-waiter:
	case <-time.After(floodFor):
	}
	floodEnd := time.Now()
	stop()
	wg.Wait()
	if w.at.IsZero() {
		w = <-waiter
	}
	mu.Lock()
	t.Logf("%d stray extends sent, %d answered, %d OK; flood %v", sent, answered, ok, floodEnd.Sub(floodStart).Round(time.Millisecond))
	if ok > 0 {
		t.Errorf("%d extends under a wrong owner answered OK", ok)
	}
	mu.Unlock()
	if w.err != nil {
		t.Fatalf("waiter: %v", w.err)
	}
	if w.m.Type != wire.TypeGranted || w.m.Token <= tok {
		t.Fatalf("waiter answered %s, want G with a token after %d", describe(w.m), tok)
	}
	if w.at.After(floodEnd) {
		t.Fatalf("the key stayed held under a flood of stray extends of its token for %v (1 s lease): the waiter was granted only %v after the flood stopped",
			floodEnd.Sub(floodStart).Round(time.Millisecond), w.at.Sub(floodEnd).Round(time.Millisecond))
	}
	t.Logf("waiter granted %v into the flood", w.at.Sub(floodStart).Round(time.Millisecond))
}
