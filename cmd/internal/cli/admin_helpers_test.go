package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
)

// adminTestCluster starts a 3-node TLS cluster with an admin port, waits
// for its leader, and returns it with the flags that reach its admin ports
// (--admin, --admin-secret-file, --tls-ca, --cluster-id).
func adminTestCluster(t *testing.T) (*local.Cluster, []string) {
	t.Helper()
	return adminTestClusterTuned(t, local.FastRaft)
}

// adminTestClusterTuned is adminTestCluster with each node's config
// adjusted by tune.
func adminTestClusterTuned(t *testing.T, tune func(*cluster.Config)) (*local.Cluster, []string) {
	t.Helper()
	dir := t.TempDir()
	secret := []byte("the-admin-secret-for-this-test-0123")
	c, err := local.Start(local.Options{Dir: filepath.Join(dir, "c"), TLS: true, AdminSecret: secret, Tune: tune})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	secretPath := filepath.Join(dir, "admin.secret")
	if err := os.WriteFile(secretPath, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for i := 0; i < c.Size(); i++ {
		addrs = append(addrs, c.AdminAddr(i))
	}
	return c, []string{"--admin", strings.Join(addrs, ","), "--admin-secret-file", secretPath,
		"--tls-ca", c.CAFile, "--cluster-id", c.ClusterID}
}
