package sidecar_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/locksm"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// A sidecar's graceful stop leaves no ghost holder (issue 39, finding 6),
// tried as docs/operations.md stops one: connection A holds k, connection
// B waits on k through the same sidecar, and the sidecar stops (the unix
// server closes, then the broker, as SIGTERM does). Stopping releases A's
// lock, which hands k to B's waiter, whose caller has just been told it
// was not acquired; that grant reaches the broker as it stops. Before the
// fix the key then stayed held by the stopped sidecar's session for the
// whole 60 s lease (3 runs in 12); the session's close now releases every
// holding of the session in the same entry. Each round checks, on the
// leader, that k is free once the sidecar has stopped.
func TestE2ESidecarStopLeavesNoGhostHolder(t *testing.T) {
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), Tune: local.FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Leader(t.Context()); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "ux")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	const rounds = 12
	for round := range rounds {
		cfg := sidecar.DefaultConfig()
		cfg.Addrs, cfg.Secret, cfg.ClusterID = c.ClientAddrs(), c.ClientSecret, c.ClusterID
		cfg.Logger = slog.New(slog.DiscardHandler)
		b, err := sidecar.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, "the cluster session attached", 20*time.Second, func() bool {
			si := b.Info().Session
			return si != nil && si.State == "attached"
		})
		ucfg := unixapi.DefaultConfig()
		ucfg.Path, ucfg.Logger = filepath.Join(dir, "s"), cfg.Logger
		srv, err := unixapi.Listen(ucfg, b)
		if err != nil {
			t.Fatal(err)
		}
		holder, waiter := dialUnix(t, srv.Path()), dialUnix(t, srv.Path())
		holder.send("ACQUIRE k 60 0")
		if l := holder.read(20 * time.Second); !strings.HasPrefix(l, "OK ") {
			t.Fatalf("round %d: holder: %q", round, l)
		}
		waiter.send("ACQUIRE k 60 30")
		li, err := c.Leader(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, "the waiter queued", 20*time.Second, func() bool {
			n := 0
			c.Node(li).ReadState(func(st *locksm.State) { n = st.QueueLen("k") })
			return n == 1
		})
		// SIGTERM's order (cmd/internal/cli sidecar): the socket, then the
		// broker.
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		var h locksm.Holder
		held := true
		testkit.WaitFor(t, "k free after the sidecar stopped", 10*time.Second, func() bool {
			c.Node(li).ReadState(func(st *locksm.State) { h, held = st.Holder("k") })
			return !held
		})
		if held {
			t.Fatalf("round %d: k is held by %+v after the sidecar stopped", round, h)
		}
	}
}
