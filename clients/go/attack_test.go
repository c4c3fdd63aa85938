package ticketing

// Interleavings of a Lock's local deadline and
// lost signal found by an adversarial test round (issue 39 follow-up).

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The connection ends (the sidecar closed it: it releases the session's
// locks and may hand their keys on) and an Extend runs right then. The
// reader publishes the connection's error (cn.err) before it loses the
// Locks (lostAll), so a call made in between fails with ErrClosed while
// its Lock is not lost: Extend returns ErrClosed and Lost() is open,
// Remaining() > 0, although the session is gone. The same for any call
// (Ping, Release) whose caller then checks its Lock. The reader's pause
// between the two steps (a preemption in the wild) is made deterministic
// by holding cn.lmu, which lostAll takes first.
func TestAttackExtendFailingWithTheConnectionFindsTheLockLost(t *testing.T) {
	c, f := pipeClient(t, "HELLO 3 events")
	l := takeLock(t, c, f, "k", 60*time.Second, nil, "OK 5")
	cn := l.cn
	cn.lmu.Lock()
	held := true
	unhold := func() {
		if held {
			held = false
			cn.lmu.Unlock()
		}
	}
	defer unhold()
	f.conn.Close() // the sidecar ends the connection
	// Until the reader published the end (or is held before it).
	for deadline := time.Now().Add(200 * time.Millisecond); cn.alive() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	type res struct {
		err  error
		lost bool
		left time.Duration
	}
	ch := async(func() res {
		err := l.Extend(context.Background(), 30*time.Second)
		return res{err, isLost(l), l.Remaining()}
	})
	var r res
	select {
	case r = <-ch:
	case <-time.After(200 * time.Millisecond):
		unhold() // the Extend waits for the Locks to be lost: let it
		r = recv(t, ch)
	}
	unhold()
	if !errors.Is(r.err, ErrClosed) {
		t.Fatalf("Extend: %v, want ErrClosed", r.err)
	}
	waitLost(t, l, LostDisconnected)
	if !r.lost || r.left != 0 {
		t.Fatalf("Extend returned ErrClosed with its Lock not lost (lost %v, Remaining %v): the session is gone", r.lost, r.left)
	}
}

// An Extend whose ctx has already ended sends nothing (it returns ctx's
// error), yet it lowered the Lock's deadline to its own send time + lease
// − Margin for good: a Lock of 60 s, Extend(ended ctx, 2 s), and the Lock
// is lost (LostDeadline) 1.73 s later although no EXTEND ever left and the
// cluster holds the lease for 60 s. Liveness: the holder gives up a lock
// it holds.
func TestAttackExtendWithAnEndedContextLeavesTheDeadline(t *testing.T) {
	c, f := pipeClient(t, "HELLO 3 events")
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c.now = clk.now
	l := takeLock(t, c, f, "k", 60*time.Second, nil, "OK 5")
	before := l.Remaining()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Extend(ctx, 2*time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Extend with an ended ctx: %v", err)
	}
	f.noReq()
	if got := l.Remaining(); got != before {
		t.Fatalf("Remaining %v after an Extend that sent nothing, want %v (unchanged)", got, before)
	}
}

// Client.Release of a Lock's key and token frees the key (the cluster may
// hand it on at once, and the sidecar sends no lost event for a release),
// but the Lock is not told: Remaining() stays > 0 and its Context is never
// cancelled, so a part of the program holding the Lock goes on believing
// it holds the key for the rest of its lease. Node's client.release marks
// such a Lock released (its remaining() is 0 from the call on).
func TestAttackClientReleaseOfALocksKeyEndsTheLock(t *testing.T) {
	c, f := pipeClient(t, "HELLO 3 events")
	l := takeLock(t, c, f, "k", 60*time.Second, nil, "OK 5")
	ch := async(func() error { return c.Release(context.Background(), "k", 5) })
	if r := f.req(); r != "RELEASE k 5" {
		t.Fatalf("request %q", r)
	}
	f.write("OK")
	if err := recv(t, ch); err != nil {
		t.Fatal(err)
	}
	if left := l.Remaining(); left != 0 {
		t.Fatalf("Remaining %v after Client.Release of the Lock's key and token, want 0: the key is free", left)
	}
}
