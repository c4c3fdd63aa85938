package ticketing

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Against a sidecar of version 4 a labelled acquire is not sent:
// ErrNotSupported; HELD and LOST are read as version 4 writes them.
func TestWithLabelVersion4Sidecar(t *testing.T) {
	c, f := pipeClient(t, "HELLO 4 events")
	if _, err := c.Acquire(context.Background(), "k", 30*time.Second, 0, WithLabel("job")); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("labelled acquire on version 4: %v", err)
	}
	ch := async(func() error {
		m, err := c.Held(context.Background())
		if err == nil && m["a:b"] != 7 {
			err = fmt.Errorf("held %v", m)
		}
		return err
	})
	if r := f.req(); r != "HELD" {
		t.Fatalf("request %q", r)
	}
	f.write("HELD 1 a:b:7")
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
	ch = async(func() error {
		hl, err := c.HeldLocks(context.Background())
		if err == nil && (len(hl) != 1 || hl[0] != HeldLock{Key: "a:b", Token: 7}) {
			err = fmt.Errorf("held locks %v", hl)
		}
		return err
	})
	if r := f.req(); r != "HELD" {
		t.Fatalf("request %q", r)
	}
	f.write("HELD 1 a:b:7")
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
}

// parseHeld reads both forms of HELD: labels ("-" is none) on version 5,
// none before; a count that does not match the fields is unexpected.
func TestParseHeldLabelled(t *testing.T) {
	hl, err := parseHeld("HELD 2 a:b:7 job-1 c:9 -", true)
	if err != nil || fmt.Sprint(hl) != fmt.Sprint([]HeldLock{{"a:b", 7, "job-1"}, {"c", 9, ""}}) {
		t.Fatalf("version 5: %v %v", hl, err)
	}
	hl, err = parseHeld("HELD 1 a:7", false)
	if err != nil || fmt.Sprint(hl) != fmt.Sprint([]HeldLock{{"a", 7, ""}}) {
		t.Fatalf("version 4: %v %v", hl, err)
	}
	for _, r := range []string{"HELD 1 a:7", "HELD 2 a:7 x", "HELD 1 :7 x", "HELD -1"} {
		if _, err := parseHeld(r, true); err == nil {
			t.Fatalf("%q accepted", r)
		}
	}
}

// A LOST line of version 5 carries the label before the keys; parseLost
// reads the token and reason of both forms.
func TestParseLostLabelled(t *testing.T) {
	if tok, why, ok := parseLost("! LOST 7 expired job-1 a b", true); !ok || tok != 7 || why != "expired" {
		t.Fatalf("version 5: %d %q %v", tok, why, ok)
	}
	if tok, why, ok := parseLost("! LOST 7 expired a", false); !ok || tok != 7 || why != "expired" {
		t.Fatalf("version 4: %d %q %v", tok, why, ok)
	}
	if _, _, ok := parseLost("! LOST 7 expired job-1", true); ok {
		t.Fatal("version 5 without keys accepted")
	}
}

// Two permits of one semaphore key are two entries of HELD: HeldLocks
// keeps both, Held maps the key to the newer token (it kept whichever
// came last in the line).
func TestHeldOfTwoPermitsOfOneKey(t *testing.T) {
	hl, err := parseHeld("HELD 3 a:5 - room:9 - room:7 -", true)
	if err != nil || len(hl) != 3 {
		t.Fatalf("parseHeld: %v %+v", err, hl)
	}
	m := heldByKey(hl)
	if len(m) != 2 || m["a"] != 5 || m["room"] != 9 {
		t.Fatalf("Held of two permits of room (tokens 9 and 7): %v, want room:9", m)
	}
}
