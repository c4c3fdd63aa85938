package cluster_test

import (
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/wire"
)

// An acquire that will join a queue (its key is held, it may wait) is held
// back (Config.ProposeLinger) until a command someone waits on comes, and
// both go in one log entry: on a hot key, the next holder's release does
// not wait behind the last holder's new acquire. A command someone waits
// on is never held back.
func TestQueueJoiningAcquireWaitsForTheNextUrgentCommand(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) { cfg.ProposeLinger = time.Minute }})
	li := c.leader()
	n := c.Node(li)
	a, b := c.dial(li), c.dial(li)
	tok := mustGrant(t, do(t, a, acquireMsg("hot", "a", 60, 0))) // urgent: a free key
	before := n.Raft().LastIndex()

	call, err := b.Start(acquireMsg("hot", "b", 60, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if got, err := cluster.LockBatchEntries(n, before); err != nil || got != 0 {
		t.Fatalf("%d lock entries (%v) while only a queue-joining acquire was asked for, want 0: it is held back", got, err)
	}
	if r := do(t, a, releaseMsg("hot", "a", tok)); r.Type != wire.TypeOK {
		t.Fatalf("release: %v", r)
	}
	select {
	case <-call.Done:
	case <-time.After(20 * time.Second):
		t.Fatal("the held-back acquire was not granted after the release")
	}
	if call.Err != nil || call.Reply.Type != wire.TypeGranted || call.Reply.Token <= tok {
		t.Fatalf("b's acquire: %v %v, want granted above %d", call.Reply, call.Err, tok)
	}
	if got, err := cluster.LockBatchEntries(n, before); err != nil || got != 1 {
		t.Fatalf("the acquire and the release took %d lock entries (%v), want 1", got, err)
	}
}
