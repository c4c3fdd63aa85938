package faults

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/sidecar"
)

// records is a slog handler that keeps every message, so a test can wait
// for the poller to have seen a file.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// count is how many messages so far contain s.
func (r *records) count(s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

func TestSpecRoundTripAndStrictness(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.json")
	if s, err := Read(path); err != nil || s.ClockOffsetMs != 0 || s.Cut != nil {
		t.Fatalf("missing file: %+v %v, want the zero spec", s, err)
	}
	want := Spec{Cut: [][2]string{{"n1", "n2"}}, Freeze: [][2]string{{"n1", "n3"}}, ClockOffsetMs: -30000, DropConnections: 4}
	if err := Write(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil || got.ClockOffsetMs != want.ClockOffsetMs || got.DropConnections != 4 || len(got.Cut) != 1 || got.Freeze[0] != want.Freeze[0] {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for _, bad := range []string{`{"cut": 7}`, `{"bogus": 1}`, `{"drop_connection": 1}`, `{} {}`} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(path); !errors.Is(err, ErrBadFile) {
			t.Errorf("%s: %v, want ErrBadFile", bad, err)
		}
	}
	if err := os.WriteFile(path, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err != nil {
		t.Errorf("empty file: %v", err)
	}
}

// The fault file drives a node's links and stamped clock; a missing file is
// no fault, a file that turns bad keeps the faults in force, and a file that
// does not parse is refused at start.
func TestNodeFaultFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "faults.json")
	base := time.Unix(1_700_000_000, 0)
	cfg := cluster.Config{Now: func() time.Time { return base }}
	rec := &records{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nf, err := Node(ctx, &cfg, path, slog.New(rec))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PeerNet != nf || cfg.Now().UnixMilli() != base.UnixMilli() || nf.IsCut("n1", "n2") {
		t.Fatal("missing file: want the network installed, no fault and no offset")
	}
	if err := Write(path, Spec{Cut: [][2]string{{"n1", "n2"}}, Freeze: [][2]string{{"n1", "n3"}}, ClockOffsetMs: -30000}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the file applied", 5*time.Second, func() bool { return rec.count("applying fault file") == 1 })
	if got := cfg.Now().Sub(base); got != -30*time.Second {
		t.Fatalf("clock offset %v, want -30s", got)
	}
	if !nf.IsCut("n2", "n1") || !nf.IsFrozen("n3", "n1") {
		t.Fatal("links not applied")
	}
	if err := os.WriteFile(path, []byte(`{"cut": 7}`), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the bad file noticed", 5*time.Second, func() bool { return rec.count("fault file unreadable") == 1 })
	if !nf.IsCut("n1", "n2") || cfg.Now().Sub(base) != -30*time.Second {
		t.Fatal("a bad file must keep the faults in force")
	}
	if err := Write(path, Spec{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the heal applied", 5*time.Second, func() bool { return rec.count("applying fault file") == 2 })
	if nf.IsCut("n1", "n2") || nf.IsFrozen("n1", "n3") || !cfg.Now().Equal(base) {
		t.Fatal("heal not applied")
	}

	if err := os.WriteFile(path, []byte(`{"bogus": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg2 := cluster.Config{}
	if _, err := Node(ctx, &cfg2, path, slog.New(rec)); !errors.Is(err, ErrBadFile) || cfg2.PeerNet != nil {
		t.Fatalf("unknown field at start: %v (peer net %v)", err, cfg2.PeerNet)
	}
}

// A file present at start is the baseline; each growth of its counter
// drops every cluster connection of a real broker, which reconnects.
func TestSidecarFaultFile(t *testing.T) {
	c, err := local.Start(local.Options{Dir: t.TempDir(), Tune: local.FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	path := filepath.Join(t.TempDir(), "faults.json")
	if err := Write(path, Spec{DropConnections: 5}); err != nil {
		t.Fatal(err)
	}
	cfg := sidecar.DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.ClusterID = c.ClientAddrs(), c.ClientSecret, c.ClusterID
	cfg.Logger = slog.New(slog.DiscardHandler)
	rec := &records{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d, err := Sidecar(ctx, &cfg, path, slog.New(rec))
	if err != nil {
		t.Fatal(err)
	}
	b, err := sidecar.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n := len(c.ClientAddrs())
	testkit.WaitFor(t, "the broker connected", 10*time.Second, func() bool { return len(b.Info().Connected) == n && d.Open() >= n })
	if err := Write(path, Spec{DropConnections: 6}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the drop", 5*time.Second, func() bool { return rec.count("dropped every cluster connection") > 0 })
	testkit.WaitFor(t, "the broker reconnected", 10*time.Second, func() bool { return len(b.Info().Connected) == n })
	if got := rec.count("dropped every cluster connection"); got != 1 {
		t.Fatalf("%d drops, want 1: a counter already present at start must not drop", got)
	}
	if err := Write(path, Spec{DropConnections: 6, Cut: [][2]string{{"n1", "n2"}}}); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, Spec{DropConnections: 7}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the second drop", 5*time.Second, func() bool { return rec.count("dropped every cluster connection") == 2 })
}

// A sidecar's cut_addrs closes its connections to those nodes and keeps
// it from dialling them until they leave the list.
func TestSidecarCutAddrs(t *testing.T) {
	c, err := local.Start(local.Options{Dir: t.TempDir(), Tune: local.FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	path := filepath.Join(t.TempDir(), "faults.json")
	cfg := sidecar.DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.ClusterID = c.ClientAddrs(), c.ClientSecret, c.ClusterID
	cfg.Logger = slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := Sidecar(ctx, &cfg, path, slog.New(&records{})); err != nil {
		t.Fatal(err)
	}
	b, err := sidecar.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	addrs := c.ClientAddrs()
	connected := func(addr string) bool {
		for _, a := range b.Info().Connected {
			if a == addr {
				return true
			}
		}
		return false
	}
	testkit.WaitFor(t, "the broker connected", 10*time.Second, func() bool { return len(b.Info().Connected) == len(addrs) })
	if err := Write(path, Spec{CutAddrs: addrs[1:]}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "only the first node connected", 10*time.Second, func() bool { return len(b.Info().Connected) == 1 && connected(addrs[0]) })
	time.Sleep(500 * time.Millisecond) // redials of the cut nodes fail
	if got := b.Info().Connected; len(got) != 1 {
		t.Fatalf("connected to %v while %v are cut", got, addrs[1:])
	}
	if err := Write(path, Spec{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the broker reconnected", 20*time.Second, func() bool { return len(b.Info().Connected) == len(addrs) })
}
