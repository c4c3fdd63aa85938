// Package gctune paces the Go garbage collector of a long-running
// ticketing process (node, sidecar, dev): it keeps a floor under the heap's
// growth between collections, so that a small heap is not collected many
// times a second, and otherwise lets the heap grow GCPercent of what is
// live, as GOGC does.
//
// Why: a node or sidecar allocates a few KiB per lock cycle but keeps
// little live (a thousand locks are a few MiB), so with Go's default
// (GOGC=100) it collected several times a second, and every collection
// scans every goroutine stack (two per client connection). Measured on the
// 2-core machine (ticketlab compare, 256 clients through a sidecar, three
// node processes): the server CPU per acquire+release cycle fell from
// 140–155 µs to 108–115 µs with GOGC=400 in every process. A fixed GOGC=400
// would let a node holding a million locks (about 210 MiB live on the
// leader) grow its heap to 1 GiB; the floor gives the small heap its
// headroom and the large one GCPercent, and both stay bounded by what is
// live.
//
// An operator's GOGC or GOMEMLIMIT in the environment wins: then the
// process keeps Go's own pacing and nothing here runs.
package gctune

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Config is the pacing policy.
type Config struct {
	// MinHeadroom is the least the heap may grow between collections,
	// bytes: the GC percent is raised until live × percent/100 reaches
	// it. Zero: DefaultMinHeadroom.
	MinHeadroom uint64
	// GCPercent is the percent used once the heap is large enough that
	// MinHeadroom does not raise it (GOGC's meaning). Zero:
	// DefaultGCPercent.
	GCPercent int
	// MaxGCPercent caps the percent for a nearly empty heap. Zero:
	// DefaultMaxGCPercent.
	MaxGCPercent int
	// Interval is how often the live heap is read and the percent set.
	// Zero: DefaultInterval.
	Interval time.Duration
}

// Defaults.
const (
	DefaultMinHeadroom  = 64 << 20
	DefaultGCPercent    = 200
	DefaultMaxGCPercent = 5000
	DefaultInterval     = time.Second
)

// DefaultConfig returns the policy the ticketing commands use.
func DefaultConfig() Config {
	return Config{MinHeadroom: DefaultMinHeadroom, GCPercent: DefaultGCPercent,
		MaxGCPercent: DefaultMaxGCPercent, Interval: DefaultInterval}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.MinHeadroom == 0 {
		c.MinHeadroom = d.MinHeadroom
	}
	if c.GCPercent <= 0 {
		c.GCPercent = d.GCPercent
	}
	if c.MaxGCPercent <= 0 {
		c.MaxGCPercent = d.MaxGCPercent
	}
	if c.Interval <= 0 {
		c.Interval = d.Interval
	}
	return c
}

// Percent is the GC percent for a live heap of live bytes under c: the
// larger of c.GCPercent and what gives c.MinHeadroom, at most
// c.MaxGCPercent (and never below c.GCPercent).
func (c Config) Percent(live uint64) int {
	c = c.withDefaults()
	if live == 0 {
		return max(c.MaxGCPercent, c.GCPercent)
	}
	need := c.MinHeadroom * 100 / live
	if need > uint64(c.MaxGCPercent) {
		need = uint64(c.MaxGCPercent)
	}
	return max(int(need), c.GCPercent)
}

// Overridden reports whether the environment sets the collector's pace
// (GOGC or GOMEMLIMIT), which then wins.
func Overridden() bool {
	return os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != ""
}

// Start paces the collector under c until ctx ends, unless Overridden. It
// sets the percent once before returning, then every c.Interval.
func Start(ctx context.Context, c Config) {
	if Overridden() {
		return
	}
	c = c.withDefaults()
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	last := -1
	apply := func() {
		metrics.Read(sample)
		var live uint64
		if sample[0].Value.Kind() == metrics.KindUint64 {
			live = sample[0].Value.Uint64()
		}
		if p := c.Percent(live); p != last {
			debug.SetGCPercent(p)
			last = p
		}
	}
	apply()
	go func() {
		t := time.NewTicker(c.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				apply()
			}
		}
	}()
}
