package unixapi

import (
	"slices"
	"testing"

	"ticketing/sidecar"
)

// A connection that does not read holds one POSITION line per pending
// ACQUIRE and key, the newest, however many places the cluster tells it;
// a place equal to the last one queued (a new leader telling every waiter
// once more) is not queued again. Before, every place was appended: a
// stalled reader of 6,000 waiting PERMITs grew the sidecar's heap by
// 16 MiB every 12 s (attack round of issue 41).
func TestPlacesCoalesceWhileUnwritten(t *testing.T) {
	ss := &session{positions: true}
	a := &acq{ss: ss, n: 5}
	b := &acq{ss: ss, n: 6}
	place := func(a *acq, key string, pos uint32) bool {
		return a.queuePlaceLocked(sidecar.Place{Key: key, Position: pos})
	}
	for pos := uint32(1000); pos >= 10; pos-- {
		place(a, "k", pos)
	}
	place(b, "k", 11)
	place(a, "m", 3) // a block's other key: its own line
	want := []string{"! POSITION 5 10 - k", "! POSITION 6 11 - k", "! POSITION 5 3 - m"}
	if !slices.Equal(ss.evq, want) {
		t.Fatalf("unwritten lines after 991 places of one ACQUIRE: %q, want %q", ss.evq, want)
	}
	if ss.evQueued != 3 {
		t.Fatalf("evQueued %d, want 3 (a replaced line is not a new one)", ss.evQueued)
	}
	// The writer takes them.
	ss.evq, ss.evGen = ss.evq[:0], ss.evGen+1
	if place(a, "k", 10) || len(ss.evq) != 0 {
		t.Fatalf("the place last told was queued again: %q", ss.evq)
	}
	if !place(a, "k", 9) || !slices.Equal(ss.evq, []string{"! POSITION 5 9 - k"}) {
		t.Fatalf("a new place after the writer took the last: %q", ss.evq)
	}
	if !place(b, "k", 10) || !slices.Equal(ss.evq, []string{"! POSITION 5 9 - k", "! POSITION 6 10 - k"}) {
		t.Fatalf("another ACQUIRE's place must not replace this one's line: %q", ss.evq)
	}
}
