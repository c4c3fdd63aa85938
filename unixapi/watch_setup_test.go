package unixapi_test

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// slowWatchBroker grants every ACQUIRE at once and takes its time setting
// up the lost watch, as a loaded broker may; it counts the watches set up
// and stopped.
type slowWatchBroker struct {
	noClusterBroker
	watches, stops atomic.Int64
}

func (b *slowWatchBroker) AcquireAsyncOpts(keys []string, owner string, lease, wait time.Duration, opts sidecar.AcquireOptions,
	done func(sidecar.Lock, error)) (func(error), error) {
	go done(sidecar.Lock{Key: keys[0], Owner: owner, Token: 7, Lease: lease}, nil)
	return func(error) {}, nil
}

func (b *slowWatchBroker) WatchLoss(sidecar.Lock, func(sidecar.Loss)) func() {
	b.watches.Add(1)
	time.Sleep(300 * time.Millisecond)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			b.stops.Add(1)
		}
	}
}

// A session that ends while a grant's lost watch is being set up (the
// holding is filed, the watch not yet recorded) still stops that watch,
// without a data race on the holding's stop func: a watch left running
// outlives its connection (a leak per such session, and a lost callback
// into a session that is gone).
func TestSessionEndDuringWatchSetupStopsWatch(t *testing.T) {
	b := &slowWatchBroker{}
	cfg := unixapi.DefaultConfig()
	cfg.Path = sockPath(t)
	cfg.Logger = testLogger()
	s, err := unixapi.Listen(cfg, b)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := net.Dial("unix", s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ACQUIRE k 30 0\n")); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the grant's watch to be set up", 5*time.Second, func() bool { return b.watches.Load() == 1 })
	time.Sleep(20 * time.Millisecond) // a separate edge for the close
	c.Close()
	testkit.WaitFor(t, "the session to end", 5*time.Second, func() bool { return s.Conns() == 0 })
	time.Sleep(500 * time.Millisecond)
	if n := b.stops.Load(); n != 1 {
		t.Fatalf("the grant's lost watch was stopped %d times after its session ended, want 1", n)
	}
}
