package unixapi_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/unixapi"
)

// Long waits on a real Server, broker and cluster (version 6): the wait
// bound follows the latest HELLO of the connection, also when HELLOs and
// ACQUIREs are pipelined in one write and when a later HELLO agrees an
// older version than an earlier one; a connection that agreed 6 queues a
// wait of an hour, and nobody else's lock is touched.
func TestLongWaitFollowsLatestHello(t *testing.T) {
	s := serve(t, nil)
	h := dial(t, s)
	k := key(t)
	tok := token(t, h.do("ACQUIRE "+k+" 250 0"))

	c := dial(t, s)
	// Before any HELLO: version 1 rules, 300 s at most.
	expectPrefix(t, c.do("ACQUIRE "+k+" 30 301"), "ERR invalid_wait ")
	// HELLO 6, then HELLO 5 and the long ACQUIRE in the same write: the
	// ACQUIRE is read under the HELLO 5 that precedes it.
	c.send("HELLO 6", "HELLO 5", "ACQUIRE "+k+" 30 3600", "ACQUIRE "+k+" 30 300.001")
	expect(t, c.read(), "HELLO 6")
	expect(t, c.read(), "HELLO 5")
	expectPrefix(t, c.read(), "ERR invalid_wait ")
	expectPrefix(t, c.read(), "ERR invalid_wait ")
	// A newer HELLO than the server's agrees the newest (6 or later);
	// five digits are never a wait.
	c.send("HELLO 9", "ACQUIRE "+k+" 30 03600.000")
	expect(t, c.read(), "HELLO "+strconv.Itoa(unixapi.ProtocolVersion))
	expectPrefix(t, c.read(), "ERR invalid_wait ")
	expectPrefix(t, c.do("ACQUIRE "+k+" 30 3600.001"), "ERR invalid_wait ")
	expect(t, c.do("PING"), "PONG")

	// Version 6: an hour-long waiter queues behind the holder.
	w := dial(t, s)
	w.send("HELLO 6 events", "ACQUIRE "+k+" 30 3600")
	expect(t, w.read(), "HELLO 6 events")
	expect(t, w.read(), "! QUEUED 2 "+k)
	testkit.WaitFor(t, "the holder keeps its lock", 5*time.Second, func() bool {
		return strings.HasPrefix(h.do("HELD"), "HELD 1 "+k+":")
	})
	// The holder's release hands the key to the hour-long waiter.
	expect(t, h.do("RELEASE "+k+" "+strconv.FormatUint(tok, 10)), "OK")
	if got := token(t, w.read()); got <= tok {
		t.Fatalf("the hour-long waiter's token %d, want above the holder's %d", got, tok)
	}
}
