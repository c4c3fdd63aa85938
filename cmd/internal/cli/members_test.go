package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/local"
)

// `ticketing members list` and `replace` against a real TLS cluster: a
// node loses its disk, comes back as a new server, and replace swaps it in.
func TestMembersListAndReplace(t *testing.T) {
	dir := t.TempDir()
	secret := []byte("the-admin-secret-for-this-test-0123")
	c, err := local.Start(local.Options{Dir: filepath.Join(dir, "c"), TLS: true, AdminSecret: secret, Tune: local.FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	secretPath := filepath.Join(dir, "admin.secret")
	os.WriteFile(secretPath, secret, 0o600)
	var addrs []string
	for i := 0; i < c.Size(); i++ {
		addrs = append(addrs, c.AdminAddr(i))
	}
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := Main(append(append([]string{"members"}, args[0]), append([]string{"--admin", strings.Join(addrs, ","),
			"--admin-secret-file", secretPath, "--tls-ca", c.CAFile, "--cluster-id", c.ClusterID}, args[1:]...)...), &out, &errb)
		return code, out.String() + errb.String()
	}
	code, out := run("list")
	if code != ExitOK || strings.Count(out, "voter")+strings.Count(out, "leader") != 3 {
		t.Fatalf("members list: exit %d\n%s", code, out)
	}
	old := c.Node(2).ServerID()
	if err := c.Wipe(2); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(2); err != nil {
		t.Fatal(err)
	}
	newID := c.Node(2).ServerID()
	if code, out := run("replace", old, newID, c.PeerAddrOf(2)); code != ExitOK {
		t.Fatalf("members replace: exit %d\n%s", code, out)
	}
	code, out = run("list")
	if code != ExitOK || !strings.Contains(out, newID) || strings.Contains(out, old) {
		t.Fatalf("after replace: exit %d\n%s", code, out)
	}
	// Removing a voter of three is refused with a reason.
	if code, out := run("remove", newID); code != ExitError || !strings.Contains(out, "3") {
		t.Fatalf("remove of a voter of 3: exit %d\n%s", code, out)
	}
}
