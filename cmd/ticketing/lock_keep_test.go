package main

import (
	"strings"
	"testing"
)

// `ticketing lock` keeps its lease by default, as etcdctl lock and consul
// lock do: a real dev cluster, and a command that runs for three and a
// half leases exits 0 with its own status. With renewal off (--no-extend
// or --extend-every 0) the same command loses the lock after one lease:
// SIGTERM, and exit 80.
func TestLockKeepsItsLeaseAgainstDev(t *testing.T) {
	sock := startDevSidecar(t)
	if code, out := run(t, sock, "lock", "--lease", "2", "keep/1", "--", "sleep", "7"); code != 0 || out != "" {
		t.Fatalf("lock --lease 2 -- sleep 7: exit %d, want 0 (renewed every lease/3)\n%s", code, out)
	}
	if code, out := run(t, sock, "lock", "--lease", "2", "keep/2", "--", "sh", "-c", "sleep 7; exit 3"); code != 3 {
		t.Fatalf("lock --lease 2 -- sh -c 'sleep 7; exit 3': exit %d, want 3 (the command's)\n%s", code, out)
	}
	for _, off := range [][]string{{"--no-extend"}, {"--extend-every", "0"}} {
		args := append(append([]string{"lock", "--lease", "2"}, off...), "keep/3", "--", "sleep", "7")
		code, out := run(t, sock, args...)
		if code != 80 || !strings.Contains(out, "lost (") || !strings.Contains(out, "SIGTERM") {
			t.Fatalf("%q: exit %d, want 80 (lost after one lease)\n%s", args, code, out)
		}
	}
}
