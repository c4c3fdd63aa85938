package sidecar

import (
	"testing"
	"time"
)

// Attack round 4 (issue 39): Broker.Close's documented effect ("stops
// taking requests, lets queued releases finish, then closes the
// connections") says nothing of the locks its callers hold, and without a
// session (or before cluster version 9) they keep their leases: a caller
// that closes the broker while its critical section still runs counts on
// Lock.ValidUntil. With a session at cluster version 9, the close ('d')
// releases every holding of the session at once: the key goes to the next
// caller inside the first holder's lease.
func TestAttack4BrokerCloseReleasesAHeldLockInsideItsLease(t *testing.T) {
	for _, mode := range []struct {
		name string
		tune func(*Config)
	}{{"sessions-off", sessionsOff}, {"sessions-auto", nil}} {
		t.Run(mode.name, func(t *testing.T) {
			c := startCluster(t)
			a := newBroker(t, c, mode.tune)
			b := newBroker(t, c, nil)
			ctx := ctxT(t, 30*time.Second)
			if mode.tune == nil {
				waitAttached(t, a, 0)
			}
			lk, err := a.Acquire(ctx, "k", "holder", 60*time.Second, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			lk2, err := b.Acquire(ctx, "k", "next", 60*time.Second, 0)
			if err == nil && time.Now().Before(lk.ValidUntil) {
				t.Fatalf("%s: k granted to another broker (token %d) %v before the closed broker's lock (token %d) ends at its ValidUntil",
					mode.name, lk2.Token, time.Until(lk.ValidUntil).Round(time.Millisecond), lk.Token)
			}
		})
	}
}
