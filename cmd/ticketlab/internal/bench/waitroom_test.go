package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"ticketing/cmd/ticketlab/internal/labtest"
)

// `ticketlab bench waitroom` in small (300 waiters, 64 per connection,
// half-second windows), on real processes: the room fills at the leader,
// drains completely, and in strict FIFO (per connection in line order with
// increasing tokens, tokens increasing across the room in the order the
// grants were read, never two holders). Figures are printed, not asserted.
// Before issue 20 the drain stalled: the sidecar sent a connection's
// pipelined ACQUIREs to the leader in no particular order, so the key went
// to a line whose reply waited behind an earlier, ungranted one.
func TestWaitRoomSmoke(t *testing.T) {
	binary, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out strings.Builder
	r, err := RunWaitRoom(ctx, WaitRoomOptions{Binary: binary, Dir: t.TempDir(), Nodes: 3, TLS: true,
		Waiters: 300, PerConn: 64, BaselineWaiters: 8, Warmup: 200 * time.Millisecond, Duration: 500 * time.Millisecond,
		Stall: 10 * time.Second, MaxWaitersPerKey: 2000, Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Queued != 300 {
		t.Errorf("%d of 300 waiters queued at the leader", r.Queued)
	}
	if r.Granted != 300 || !r.FIFOOK() {
		t.Errorf("the room did not drain in strict FIFO: %d of 300 granted, %d stalled (%s), violations %q, other replies %v",
			r.Granted, r.Stalled, r.StallNote, r.FIFO, r.Other)
	}
	if !strings.Contains(r.String(), "| strict FIFO |") {
		t.Errorf("no FIFO row in the report:\n%s", r)
	}
}

// With --positions every waiter of the room is told its place in line
// (`! POSITION`, issue 41) while the gate holds the key, every place is at
// least 1 and only goes down, none is below the waiters certainly still
// ahead of it, and the room still drains in strict FIFO. The nodes walk
// the lines every 100 ms, so each waiter hears several places.
func TestWaitRoomPositions(t *testing.T) {
	binary, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out strings.Builder
	r, err := RunWaitRoom(ctx, WaitRoomOptions{Binary: binary, Dir: t.TempDir(), Nodes: 3, TLS: true,
		Waiters: 300, PerConn: 64, BaselineWaiters: 8, Warmup: 200 * time.Millisecond, Duration: 500 * time.Millisecond,
		Stall: 10 * time.Second, MaxWaitersPerKey: 2000, Positions: true, NodeArgs: []string{"--position-interval", "100ms"}, Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Granted != 300 || !r.FIFOOK() {
		t.Fatalf("the room did not drain in strict FIFO: %d of 300 granted, %d stalled (%s), violations %q, other replies %v",
			r.Granted, r.Stalled, r.StallNote, r.FIFO, r.Other)
	}
	ps := r.Pos
	if ps == nil {
		t.Fatal("no position figures with Positions")
	}
	if ps.Told != 300 || ps.Untold != 0 {
		t.Errorf("%d of 300 waiters were told their place, %d granted without", ps.Told, ps.Untold)
	}
	if ps.Rises+ps.Zero+ps.TooLow != 0 {
		t.Errorf("places: %d rises, %d below 1 (%s), %d below the waiters ahead (%s)", ps.Rises, ps.Zero, ps.FirstRise, ps.TooLow, ps.FirstLow)
	}
	if ps.Events < 300 {
		t.Errorf("%d `! POSITION` events for 300 waiters", ps.Events)
	}
	if !strings.Contains(r.String(), "| every place ≥ 1 and only going down | | yes |") {
		t.Errorf("no monotony row in the report:\n%s", r)
	}
}

// The room survives leader SIGKILLs while it drains (issue 31): every
// waiter keeps its place in the replicated line, so the room drains
// completely and in strict FIFO, with no INDETERMINATE. Before sidecar
// sessions a new leader dropped the whole line, and every waiter still in
// it was answered INDETERMINATE.
func TestWaitRoomSurvivesLeaderKills(t *testing.T) {
	binary, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out strings.Builder
	r, err := RunWaitRoom(ctx, WaitRoomOptions{Binary: binary, Dir: t.TempDir(), Nodes: 3, TLS: true,
		Waiters: 300, PerConn: 64, BaselineWaiters: 8, Warmup: 200 * time.Millisecond, Duration: 500 * time.Millisecond,
		Stall: 30 * time.Second, MaxWaitersPerKey: 2000, Kills: 2, Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if len(r.Kills) != 2 {
		t.Fatalf("%d leader kills, want 2", len(r.Kills))
	}
	if r.Granted != 300 || !r.FIFOOK() {
		t.Errorf("the room did not drain in strict FIFO through the kills: %d of 300 granted, %d stalled (%s), violations %q, other replies %v",
			r.Granted, r.Stalled, r.StallNote, r.FIFO, r.Other)
	}
}
