// Revokes end to end: holders on real unix sockets (unixapi), the broker,
// and three real nodes over TCP with an admin port, through which an
// operator revokes a holding (cluster protocol 14).
package sidecar_test

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

var revokeAdminSecret = []byte("the-admin-secret-0123456789abcdef")

// startRevokeSetup is three real nodes with an admin port at cluster
// version 14, a broker settled on the leader and a unix API server on
// it; it returns the server and an admin client of the cluster.
func startRevokeSetup(t *testing.T) (*unixapi.Server, *client.AdminCluster, *sidecar.Broker) {
	t.Helper()
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), Tune: local.FastRaft,
		AdminSecret: revokeAdminSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	li, err := c.Leader(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "cluster version 14", 40*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionRevoke
	})
	b := newSettledBroker(t, c, li, nil)
	dir, err := os.MkdirTemp("", "ux") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ucfg := unixapi.DefaultConfig()
	ucfg.Path, ucfg.Logger = filepath.Join(dir, "s"), slog.New(slog.DiscardHandler)
	srv, err := unixapi.Listen(ucfg, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	var addrs []string
	for i := 0; i < c.Size(); i++ {
		addrs = append(addrs, c.AdminAddr(i))
	}
	return srv, &client.AdminCluster{Addrs: addrs, Config: client.AdminConfig{Secret: revokeAdminSecret, ClusterID: c.ClusterID,
		TLS: c.ClientTLS}}, b
}

// lineConn is one unix connection read line by line.
type lineConn struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func dialLines(t *testing.T, path string) *lineConn {
	t.Helper()
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return &lineConn{t: t, nc: nc, br: bufio.NewReader(nc)}
}

func (c *lineConn) send(lines ...string) {
	c.t.Helper()
	if _, err := c.nc.Write([]byte(strings.Join(lines, "\n") + "\n")); err != nil {
		c.t.Fatal(err)
	}
}

// next is the next line (without "\n"), within 30 s.
func (c *lineConn) next() string {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	l, err := c.br.ReadString('\n')
	if err != nil {
		c.t.Fatalf("read: %q %v", l, err)
	}
	return strings.TrimSuffix(l, "\n")
}

// expect reads the next lines and fails unless they are want.
func (c *lineConn) expect(want ...string) {
	c.t.Helper()
	for _, w := range want {
		if got := c.next(); got != w {
			c.t.Fatalf("got %q, want %q", got, w)
		}
	}
}

// granted reads an "OK <token>" reply.
func (c *lineConn) granted() uint64 {
	c.t.Helper()
	l := c.next()
	tok, err := strconv.ParseUint(strings.TrimPrefix(l, "OK "), 10, 64)
	if !strings.HasPrefix(l, "OK ") || err != nil {
		c.t.Fatalf("got %q, want OK <token>", l)
	}
	return tok
}

// A holder whose lock an operator revokes through a node's admin port is
// told so by its sidecar: a connection that agreed version 9 with events
// gets `! REVOKED <token> <by>[ <why>]` right before `! LOST <token>
// revoked ...`; one that agreed version 5 only the LOST line (reason
// revoked, with its label field). Afterwards the lock is not the
// connection's: RELEASE answers not_held and HELD omits it. The broker's
// watchers and the unix API's counters count the revokes.
func TestE2ERevokeToldOnUnixSocket(t *testing.T) {
	srv, admin, b := startRevokeSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	revoke := func(key string, tok uint64, by, why string) {
		t.Helper()
		rep, err := admin.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: key, Token: tok, By: by, Reason: why})
		if err != nil || rep.Revoked == nil || rep.Revoked.Token != tok {
			t.Fatalf("revoke %s %d: %+v %v", key, tok, rep, err)
		}
	}

	v9 := dialLines(t, srv.Path())
	v9.send("HELLO 9 events", "ACQUIRE stuck 200 0 label=job-1", "ACQUIRE quiet 200 0", "ACQUIRE kept 200 0")
	v9.expect("HELLO 9 events")
	t1, tq, tk := v9.granted(), v9.granted(), v9.granted()
	v5 := dialLines(t, srv.Path())
	v5.send("HELLO 5 events", "ACQUIRE old 200 0")
	v5.expect("HELLO 5 events")
	t2 := v5.granted()
	// A watcher of the broker itself hears who and why too.
	held := sidecar.Lock{Key: "stuck", Token: t1}
	loss := make(chan sidecar.Loss, 1)
	stop := b.WatchLoss(held, func(l sidecar.Loss) { loss <- l })
	defer stop()

	revoke("stuck", t1, "ops@host", "app crashed,  lock stuck")
	v9.expect("! REVOKED "+strconv.FormatUint(t1, 10)+" ops@host app crashed,  lock stuck",
		"! LOST "+strconv.FormatUint(t1, 10)+" revoked job-1 stuck")
	select {
	case l := <-loss:
		if l != (sidecar.Loss{Reason: sidecar.LostRevoked, By: "ops@host", Why: "app crashed,  lock stuck"}) {
			t.Fatalf("the broker's watcher was told %+v", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the broker's watcher was not told")
	}
	// No reason: no space after who.
	revoke("quiet", tq, "admin", "")
	v9.expect("! REVOKED "+strconv.FormatUint(tq, 10)+" admin", "! LOST "+strconv.FormatUint(tq, 10)+" revoked - quiet")
	v9.send("RELEASE stuck "+strconv.FormatUint(t1, 10), "RELEASE quiet "+strconv.FormatUint(tq, 10), "HELD")
	for range 2 {
		if l := v9.next(); !strings.HasPrefix(l, "ERR not_held ") {
			t.Fatalf("RELEASE of a revoked lock: %q, want ERR not_held", l)
		}
	}
	v9.expect("HELD 1 kept:" + strconv.FormatUint(tk, 10) + " -")

	revoke("old", t2, "ops@host", "maintenance")
	v5.expect("! LOST " + strconv.FormatUint(t2, 10) + " revoked - old")
	v5.send("RELEASE old "+strconv.FormatUint(t2, 10), "HELD", "PING")
	if l := v5.next(); !strings.HasPrefix(l, "ERR not_held ") {
		t.Fatalf("RELEASE of a revoked lock: %q, want ERR not_held", l)
	}
	v5.expect("HELD 0", "PONG") // no REVOKED line on a version-5 connection

	if n := srv.Stats().LostEvents[sidecar.LostRevoked]; n != 3 {
		t.Fatalf("LOST revoked lines counted: %d, want 3", n)
	}
	// One per watcher told: the sessions' three and the test's own.
	if v := counter(t, b.MetricsRegistry(), "ticketing_sidecar_locks_lost_total", "reason", "revoked"); v != 4 {
		t.Fatalf("ticketing_sidecar_locks_lost_total{reason=revoked} %v, want 4", v)
	}
	// The lock kept is untouched.
	v9.send("RELEASE kept " + strconv.FormatUint(tk, 10))
	v9.expect("OK")
}
