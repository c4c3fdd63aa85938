package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"time"
)

// FaultSpec is the content of a sidecar fault file (tests only), JSON:
//
//	{"drop_connections": 3}
//
// DropConnections is a counter: each time it grows, the broker drops every
// cluster connection it has (Broker.DropConnections). A missing file is the
// zero spec.
type FaultSpec struct {
	DropConnections uint64 `json:"drop_connections"`
}

// WriteFaultFile replaces path with spec atomically.
func WriteFaultFile(path string, spec FaultSpec) error {
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// WatchFaultFile polls path every interval until ctx ends and applies it to
// b (see FaultSpec). The counter seen at the first read is the baseline: a
// sidecar restarted next to an old file does not drop at once.
func WatchFaultFile(ctx context.Context, path string, interval time.Duration, b *Broker, log *slog.Logger) {
	log.Warn("FAULT INJECTION ENABLED: this sidecar obeys a fault file; never use this in production", "fault_file", path)
	var seen uint64
	first := true
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		raw, err := os.ReadFile(path)
		var spec FaultSpec
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			log.Error("fault file unreadable", "path", path, "err", err)
		default:
			if err := json.Unmarshal(raw, &spec); err != nil {
				log.Error("fault file does not parse", "path", path, "err", err)
				spec.DropConnections = seen
			}
		}
		if !first && spec.DropConnections > seen {
			n := b.DropConnections()
			log.Warn("FAULT INJECTION: dropped every cluster connection", "connections", n, "counter", spec.DropConnections)
		}
		if first || spec.DropConnections > seen {
			seen = spec.DropConnections
		}
		first = false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
