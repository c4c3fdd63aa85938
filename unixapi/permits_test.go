package unixapi_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// permitOf parses "OK <token> <slot>", a PERMIT's grant.
func permitOf(t *testing.T, reply string) (token uint64, slot uint32) {
	t.Helper()
	f := strings.Fields(reply)
	if len(f) != 3 || f[0] != "OK" {
		t.Fatalf("want OK <token> <slot>, got %q", reply)
	}
	tok, err1 := strconv.ParseUint(f[1], 10, 64)
	s, err2 := strconv.ParseUint(f[2], 10, 32)
	if err1 != nil || err2 != nil || tok == 0 {
		t.Fatalf("want OK <token> <slot>, got %q", reply)
	}
	return tok, uint32(s)
}

// Semaphores over the socket (version 8), through a real sidecar broker
// and a real cluster: PERMITS defines a key with n permits; PERMIT takes
// one with its own token and the lowest free slot, queues FIFO (QUEUED
// and POSITION come as for an ACQUIRE), and a release hands the freed slot to the
// head with a fresh token; a lock's ACQUIRE of the key and a PERMIT of a
// lock key are definite errors; EXTEND, HELD and RELEASE work per permit
// by token; raising n grants a waiter at once; an idle semaphore can be
// removed and the key is a lock's again.
func TestPermitsOverTheSocket(t *testing.T) {
	s := serve(t, nil)
	k, lockKey := key(t), key(t)
	op, a, b, c := dial(t, s), dial(t, s), dial(t, s), dial(t, s)
	expect(t, op.do("PERMITS "+k+" 2"), "OK")
	ta, sa := permitOf(t, a.do("PERMIT "+k+" 30 0 label=buyer-a"))
	tb, sb := permitOf(t, b.do("PERMIT "+k+" 30 0"))
	if sa != 0 || sb != 1 || tb <= ta {
		t.Fatalf("grants (%d, slot %d), (%d, slot %d): want slots 0 and 1, tokens growing", ta, sa, tb, sb)
	}
	expect(t, c.do("PERMIT "+k+" 30 0"), "BUSY")
	expect(t, c.do("HELLO 8 events"), "HELLO 8 events")
	c.send("PERMIT " + k + " 30 20")
	// The line number of that PERMIT on c: its third request line.
	expect(t, c.read(), fmt.Sprintf("! QUEUED 3 %s", k))
	// Its place in line comes as for an ACQUIRE's (version 7): first, no
	// estimate before two hand-offs.
	expect(t, c.read(), fmt.Sprintf("! POSITION 3 1 - %s", k))

	expectPrefix(t, a.do("ACQUIRE "+k+" 30 0"), "ERR is_semaphore ")
	expectPrefix(t, a.do("ACQUIRE "+lockKey+" "+k+" 30 0"), "ERR is_semaphore ")
	expectPrefix(t, a.do("PERMIT "+lockKey+" 30 0"), "ERR not_semaphore ")
	lt := token(t, a.do("ACQUIRE "+lockKey+" 30 0"))
	expectPrefix(t, op.do("PERMITS "+lockKey+" 3"), "ERR in_use ")
	expectPrefix(t, op.do("PERMITS "+k+" 0"), "ERR in_use ")

	expect(t, b.do(fmt.Sprintf("EXTEND %s %d 60", k, tb)), "OK")
	expect(t, b.do("HELD"), fmt.Sprintf("HELD 1 %s:%d", k, tb))
	// a's release frees slot 0: c, the head, gets it with a fresh token.
	expect(t, a.do(fmt.Sprintf("RELEASE %s %d", k, ta)), "OK")
	tc, sc := permitOf(t, c.read())
	if sc != 0 || tc <= tb {
		t.Fatalf("hand-off: token %d slot %d, want slot 0 and a token above %d", tc, sc, tb)
	}
	// Raising n to 3 with a waiter grants it at once, in slot 2.
	d := dial(t, s)
	d.send("PERMIT " + k + " 30 20")
	expect(t, op.do("PERMITS "+k+" 3"), "OK")
	td, sd := permitOf(t, d.read())
	if sd != 2 || td <= tc {
		t.Fatalf("raise: token %d slot %d, want slot 2", td, sd)
	}
	for _, r := range []struct {
		c   *conn
		tok uint64
	}{{b, tb}, {c, tc}, {d, td}} {
		expect(t, r.c.do(fmt.Sprintf("RELEASE %s %d", k, r.tok)), "OK")
	}
	expect(t, op.do("PERMITS "+k+" 0"), "OK")
	// The key is an ordinary key again; the lock key's holder releases.
	expect(t, a.do(fmt.Sprintf("RELEASE %s %d", lockKey, lt)), "OK")
	token(t, a.do("ACQUIRE "+k+" 30 0"))
}
