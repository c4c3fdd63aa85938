// What a caller of the unix API (and of the Go broker) is told when the
// cluster has no leader, end to end: three real nodes over TCP, the
// broker, and a real unix socket.
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
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// outageSetup is a 3-node cluster, a broker that knows its serving leader
// (newSettledBroker) and a unix API server on it.
type outageSetup struct {
	c    *local.Cluster
	li   int // the leader
	b    *sidecar.Broker
	path string // the unix socket
}

func startOutageSetup(t *testing.T, tune func(*sidecar.Config)) *outageSetup {
	t.Helper()
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), Tune: local.FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	li, err := c.Leader(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	b := newSettledBroker(t, c, li, tune)
	dir, err := os.MkdirTemp("", "ux") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ucfg := unixapi.DefaultConfig()
	ucfg.Path, ucfg.Logger = filepath.Join(dir, "s"), slog.New(slog.DiscardHandler)
	srv, err := unixapi.Listen(ucfg, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return &outageSetup{c: c, li: li, b: b, path: srv.Path()}
}

// newSettledBroker starts a broker on c and waits until it knows leader li
// and its cluster session (unless sessions are off) is attached there.
func newSettledBroker(t *testing.T, c *local.Cluster, li int, tune func(*sidecar.Config)) *sidecar.Broker {
	t.Helper()
	cfg := sidecar.DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.ClusterID = c.ClientAddrs(), c.ClientSecret, c.ClusterID
	cfg.Logger = slog.New(slog.DiscardHandler)
	if tune != nil {
		tune(&cfg)
	}
	b, err := sidecar.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	testkit.WaitFor(t, "the broker to know the leader (its session attached there)", 20*time.Second, func() bool {
		in := b.Info()
		return in.Leader == c.ClientAddr(li) && (cfg.Sessions == sidecar.SessionsOff || in.Session != nil && in.Session.State == "attached")
	})
	return b
}

// Issue 32, defect 1. An ACQUIRE with a wait that the sidecar holds while
// no leader serves, until its wait has run out, is answered TIMEOUT by the
// sidecar: it is never sent with what is left of its wait (0), which the
// new leader would answer BUSY for the held key, the reply PROTOCOL.md
// keeps for wait 0. The outage is the leader stopped and one follower
// down too (no quorum), the follower coming back only after the wait ran
// out, so the outcome does not depend on how fast an election is.
func TestE2EWaitRunOutWithoutLeaderIsTimeoutNotBusy(t *testing.T) {
	s := startOutageSetup(t, func(cfg *sidecar.Config) {
		// The outage must end before the sidecar gives the held ACQUIRE
		// up as unavailable, however slow the machine.
		cfg.LeaderWait = time.Minute
	})
	holder := dialUnix(t, s.path)
	holder.send("ACQUIRE k 60 0")
	ok := holder.read(30 * time.Second)
	if !strings.HasPrefix(ok, "OK ") {
		t.Fatalf("holding k: %q", ok)
	}
	fi := (s.li + 1) % 3
	if err := s.c.Stop(s.li); err != nil {
		t.Fatal(err)
	}
	if err := s.c.Stop(fi); err != nil {
		t.Fatal(err)
	}
	waiter := dialUnix(t, s.path)
	sent := time.Now()
	waiter.send("ACQUIRE k 60 0.5")
	// No leader can serve before the follower is back: let the wait run
	// out first.
	time.Sleep(time.Second)
	if err := s.c.Restart(fi); err != nil {
		t.Fatal(err)
	}
	r := waiter.read(90 * time.Second)
	if r != "TIMEOUT" {
		t.Fatalf("ACQUIRE k 60 0.5 held while no leader served, answered %v after it was sent: %q, want TIMEOUT (BUSY is wait 0's)",
			time.Since(sent).Round(time.Millisecond), r)
	}
	// The holder still holds k, and the sidecar serves again.
	holder.send("RELEASE k " + strings.TrimPrefix(ok, "OK "))
	if r := holder.read(60 * time.Second); r != "OK" {
		t.Fatalf("releasing k after the outage: %q", r)
	}
}
