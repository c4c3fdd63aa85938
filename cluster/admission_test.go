package cluster

import (
	"testing"
	"time"
)

func TestGateDelaysEscalateAndDecay(t *testing.T) {
	now := time.Unix(1000, 0)
	g := newGate(2, 100*time.Millisecond, 700*time.Millisecond)
	g.now = func() time.Time { return now }

	var got []time.Duration
	for i := 0; i < 5; i++ {
		if !g.enter("10.0.0.1") {
			t.Fatal("refused with nothing in admission")
		}
		d, n := g.leave("10.0.0.1", true)
		if n != i+1 {
			t.Fatalf("failure count %d, want %d", n, i+1)
		}
		got = append(got, d)
	}
	want := []time.Duration{100, 200, 400, 700, 700}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("delays %v, want %v ms", got, want)
		}
	}
	// Another address is not slowed down by the first one's failures.
	g.enter("10.0.0.2")
	if d, _ := g.leave("10.0.0.2", true); d != 100*time.Millisecond {
		t.Fatalf("other address delayed %v", d)
	}
	// Failures older than failureMemory are forgotten.
	now = now.Add(failureMemory + time.Second)
	g.enter("10.0.0.1")
	if d, n := g.leave("10.0.0.1", true); d != 100*time.Millisecond || n != 1 {
		t.Fatalf("after a quiet minute: delay %v count %d", d, n)
	}
	// A success clears the address's record.
	g.enter("10.0.0.1")
	g.leave("10.0.0.1", false)
	g.enter("10.0.0.1")
	if d, n := g.leave("10.0.0.1", true); d != 100*time.Millisecond || n != 1 {
		t.Fatalf("after a success: delay %v count %d", d, n)
	}
}

func TestGateBoundsConnectionsInAdmission(t *testing.T) {
	g := newGate(2, time.Millisecond, time.Millisecond)
	if first, second := g.enter("a"), g.enter("a"); !first || !second { // each enter admits one
		t.Fatal("refused below the cap")
	}
	if g.enter("a") {
		t.Fatal("admitted a third connection from one address")
	}
	if !g.enter("b") {
		t.Fatal("another address refused")
	}
	g.leave("a", false)
	if !g.enter("a") {
		t.Fatal("refused after one left")
	}
}

func TestGatePrunesIdleAddresses(t *testing.T) {
	now := time.Unix(1000, 0)
	g := newGate(1, time.Millisecond, time.Millisecond)
	g.now = func() time.Time { return now }
	for i := 0; i < 5000; i++ {
		ip := "10.0." + string(rune('a'+i%26)) + "." + time.Duration(i).String()
		g.enter(ip)
		g.leave(ip, true)
		now = now.Add(time.Millisecond)
	}
	now = now.Add(2 * failureMemory)
	g.enter("x")
	if len(g.m) > 4096 {
		t.Fatalf("gate remembers %d addresses", len(g.m))
	}
}
