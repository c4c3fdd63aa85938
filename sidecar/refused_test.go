package sidecar

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// logRecords is a slog handler that keeps every record (the tests read
// what the broker logged).
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *logRecords) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecords) WithGroup(string) slog.Handler      { return h }

// count returns how many records of level have message msg, per "addr"
// attribute, and calls each on every such record's "err".
func (h *logRecords) count(level slog.Level, msg string, each func(error)) map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := map[string]int{}
	for _, r := range h.recs {
		if r.Level != level || r.Message != msg {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "addr":
				n[a.Value.String()]++
			case "err":
				if err, ok := a.Value.Any().(error); ok && each != nil {
					each(err)
				}
			}
			return true
		})
	}
	return n
}

const refusedMsg = "a node refused the connection: check --cluster-id, the secret and --tls-ca against the nodes' (retrying; further failures at debug level)"

// A sidecar whose settings the nodes refuse (here another cluster id, as
// `ticketing sidecar` without --cluster-id against nodes of cluster
// "prod") says so at warn level, once per node until it connects, while
// its retries stay at debug level. It used to log them at debug level
// only: the sidecar served its socket with INFO leader=- and said nothing.
func TestBrokerWarnsOnceWhenNodesRefuseIt(t *testing.T) {
	c := startCluster(t)
	h := &logRecords{}
	b := newBrokerAddrs(t, c, c.ClientAddrs(), func(cfg *Config) {
		cfg.ClusterID = "not-" + c.ClusterID
		cfg.Logger = slog.New(h)
	})
	testkit.WaitFor(t, "a few retries to every node", 30*time.Second, func() bool {
		retries := h.count(slog.LevelDebug, "connect failed", nil)
		for _, a := range c.ClientAddrs() {
			if retries[a] < 2 {
				return false
			}
		}
		return true
	})
	warns := h.count(slog.LevelWarn, refusedMsg, func(err error) {
		if !errors.Is(err, wire.ErrWrongCluster) {
			t.Errorf("warning's err = %v; want one wrapping wire.ErrWrongCluster", err)
		}
	})
	for _, a := range c.ClientAddrs() {
		if warns[a] != 1 {
			t.Errorf("%s: %d refusal warnings; want 1 (then debug until it connects): %v", a, warns[a], warns)
		}
	}

	// An acquire given up for want of a leader says why: the caller,
	// who does not read the sidecar's log, learns that a setting is
	// wrong, not only that the cluster is unavailable.
	_, err := b.Acquire(context.Background(), "k", "w0", 10*time.Second, 0)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrRefused) {
		t.Errorf("acquire through a refused sidecar: %v; want ErrUnavailable wrapping ErrRefused", err)
	}

	// With the nodes' settings, no such warning.
	ok := &logRecords{}
	good := newBroker(t, c, func(cfg *Config) { cfg.Logger = slog.New(ok) })
	if n := ok.count(slog.LevelWarn, refusedMsg, nil); len(n) != 0 {
		t.Errorf("a broker with the right settings warned of refusals: %v", n)
	}
	// Nor does its unavailable name a refusal: with every node stopped,
	// an acquire is given up for want of a leader, not of settings.
	for i := range c.ClientAddrs() {
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := good.Acquire(context.Background(), "k", "w0", 10*time.Second, 0); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRefused) {
		t.Errorf("acquire with every node down: %v; want ErrUnavailable without ErrRefused", err)
	}
}
