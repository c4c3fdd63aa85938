package faults

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/netfault"
	"ticketing/sidecar"
)

// Node plugs the fault file at path into a node's config: a
// netfault.Network as its PeerNet, driven by the file's cut and frozen
// links, and the file's clock offset in front of its Now (which moves only
// the wall time stamped into commands: lease and wait timers run on the
// monotonic clock, so that is exactly how a wall-clock jump reaches a
// node). The file is applied before Node returns and then followed until
// ctx ends (Watch). It returns the Network.
func Node(ctx context.Context, cfg *cluster.Config, path string, log *slog.Logger) (*netfault.Network, error) {
	log = log.With("part", "faults", "node", cfg.NodeID)
	nf := netfault.New()
	var offset atomic.Int64 // ms added to the stamped wall clock
	base := cfg.Now
	if base == nil {
		base = time.Now
	}
	first := true
	err := Watch(ctx, path, PollInterval, log, func(s Spec) {
		nf.SetLinks(s.Cut, s.Freeze)
		offset.Store(s.ClockOffsetMs)
		if !first {
			log.Warn("FAULT INJECTION: applying fault file", "cut", s.Cut, "freeze", s.Freeze, "clock_offset_ms", s.ClockOffsetMs)
		}
		first = false
	})
	if err != nil {
		return nil, err
	}
	log.Warn("FAULT INJECTION ENABLED: this node obeys a fault file; never use this in production", "fault_file", path)
	cfg.PeerNet = nf
	cfg.Now = func() time.Time { return base().Add(time.Duration(offset.Load()) * time.Millisecond) }
	return nf, nil
}

// Sidecar plugs the fault file at path into a sidecar's broker config: a
// netfault.Dropper as its Dialer, which drops every cluster connection
// each time the file's drop_connections counter grows. The counter seen at
// the first read is the baseline: a sidecar restarted next to an old file
// does not drop at once. The file is read before Sidecar returns and then
// followed until ctx ends (Watch). It returns the Dropper.
func Sidecar(ctx context.Context, cfg *sidecar.Config, path string, log *slog.Logger) (*netfault.Dropper, error) {
	log = log.With("part", "faults")
	d := &netfault.Dropper{}
	var seen uint64
	first := true
	err := Watch(ctx, path, PollInterval, log, func(s Spec) {
		if !first && s.DropConnections > seen {
			n := d.Drop()
			log.Warn("FAULT INJECTION: dropped every cluster connection", "connections", n, "counter", s.DropConnections)
		}
		if first || s.DropConnections > seen {
			seen = s.DropConnections
		}
		first = false
	})
	if err != nil {
		return nil, err
	}
	log.Warn("FAULT INJECTION ENABLED: this sidecar obeys a fault file; never use this in production", "fault_file", path)
	cfg.Dialer = d.Dial
	return d, nil
}
