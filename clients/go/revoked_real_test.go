package ticketing_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// A Lock an operator revokes through a node's admin port, against a real
// sidecar and a real cluster with an admin port: the Client agrees
// version 9, the Lock is lost with LostRevoked, Revoked names who and why
// (the reason with its spaces), the Context's cause is a *LostError whose
// text says so, and its Release answers not_held. Another Lock of the same
// Client is untouched.
func TestLockRevokedRealSidecar(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, _, sock, admin := revokeRig(t, ctx)

	cl, err := ticketing.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	if v, err := cl.Hello(ctx); err != nil || v != bothSpeak || v < 9 {
		t.Fatalf("Hello: %d %v, want %d (at least 9)", v, err, bothSpeak)
	}
	lk, err := cl.Lock(ctx, "go/revoked", 200*time.Second, 0, ticketing.WithLabel("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	kept, err := cl.Lock(ctx, "go/kept", 200*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := admin.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "go/revoked", Token: lk.Token(), By: "ops@host",
		Reason: "stuck holder,  see INC-7"})
	if err != nil || rep.Revoked == nil || rep.Revoked.Token != lk.Token() {
		t.Fatalf("revoke: %+v %v", rep, err)
	}
	select {
	case <-lk.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("the revoked Lock was not lost")
	}
	if r := lk.LostReason(); r != ticketing.LostRevoked {
		t.Fatalf("LostReason %q, want %q", r, ticketing.LostRevoked)
	}
	if by, why, ok := lk.Revoked(); !ok || by != "ops@host" || why != "stuck holder,  see INC-7" {
		t.Fatalf("Revoked: %q %q %v", by, why, ok)
	}
	cause := context.Cause(lk.Context())
	var le *ticketing.LostError
	if !errors.Is(cause, ticketing.ErrLockLost) || !errors.As(cause, &le) || le.Reason != ticketing.LostRevoked ||
		le.By != "ops@host" || le.Why != "stuck holder,  see INC-7" || le.Token != lk.Token() ||
		!strings.Contains(cause.Error(), "(revoked by ops@host: stuck holder,  see INC-7)") {
		t.Fatalf("cause: %v", cause)
	}
	if err := lk.Release(ctx); !errors.Is(err, ticketing.ErrNotHeld) {
		t.Fatalf("Release of the revoked Lock: %v, want not_held", err)
	}
	if kept.LostReason() != "" {
		t.Fatalf("the other Lock is lost: %s", kept.LostReason())
	}
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// revokeRig starts what a revoke's end-to-end tests need: a real 3-node
// cluster with an admin port at cluster version 14, a real sidecar and
// its unix socket (sock), and the admin client.
func revokeRig(t *testing.T, ctx context.Context) (c *local.Cluster, b *sidecar.Broker, sock string, admin client.AdminCluster) {
	t.Helper()
	secret := []byte("the-admin-secret-0123456789abcdef")
	var err error
	c, err = local.Start(local.Options{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), Tune: local.FastRaft, AdminSecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	li, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "cluster version 14", 40*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionRevoke
	})
	bcfg := sidecar.DefaultConfig()
	bcfg.Addrs, bcfg.Secret, bcfg.ClusterID, bcfg.Logger = c.ClientAddrs(), c.ClientSecret, c.ClusterID, slog.New(slog.DiscardHandler)
	b, err = sidecar.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	dir, err := os.MkdirTemp("", "tkr")
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
	testkit.WaitFor(t, "the sidecar to know the leader", 30*time.Second, func() bool { return b.Info().Leader != "" })
	var addrs []string
	for i := 0; i < c.Size(); i++ {
		addrs = append(addrs, c.AdminAddr(i))
	}
	return c, b, ucfg.Path, client.AdminCluster{Addrs: addrs, Config: client.AdminConfig{Secret: secret, ClusterID: c.ClusterID, TLS: c.ClientTLS}}
}
