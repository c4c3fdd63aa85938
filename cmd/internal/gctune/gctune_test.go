package gctune

import (
	"context"
	"runtime/debug"
	"testing"
)

func TestPercent(t *testing.T) {
	c := DefaultConfig()
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{0, DefaultMaxGCPercent},
		{1 << 10, DefaultMaxGCPercent}, // nearly empty: capped
		{4 << 20, 1600},                // 64 MiB of headroom over 4 MiB live
		{(64 << 20) / 3, 300},          // rounded down
		{(64 << 20) * 100 / 250, 250},
		{32 << 20, 200},               // the floor and GCPercent agree
		{64 << 20, DefaultGCPercent},  // the floor no longer raises it
		{210 << 20, DefaultGCPercent}, // a million locks on a leader
	} {
		if got := c.Percent(tc.live); got != tc.want {
			t.Errorf("Percent(%d) = %d, want %d", tc.live, got, tc.want)
		}
	}
	small := Config{MinHeadroom: 1 << 20, GCPercent: 100, MaxGCPercent: 400}
	if got := small.Percent(1 << 20); got != 100 {
		t.Errorf("custom Percent(1 MiB) = %d, want 100", got)
	}
	if got := small.Percent(1 << 10); got != 400 {
		t.Errorf("custom Percent(1 KiB) = %d, want 400 (the cap)", got)
	}
}

// Start sets the percent at once, and an operator's GOGC wins.
func TestStart(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	Start(ctx, Config{MinHeadroom: 1 << 40, GCPercent: 100, MaxGCPercent: 777})
	if got := debug.SetGCPercent(100); got != 777 {
		t.Fatalf("after Start the GC percent was %d, want 777 (a test binary's heap is far below 1 TiB)", got)
	}

	t.Setenv("GOGC", "150")
	if !Overridden() {
		t.Fatal("GOGC set, but not Overridden")
	}
	debug.SetGCPercent(150)
	Start(ctx, Config{MinHeadroom: 1 << 40, GCPercent: 100, MaxGCPercent: 777})
	if got := debug.SetGCPercent(150); got != 150 {
		t.Fatalf("with GOGC=150 Start changed the percent to %d", got)
	}
}
