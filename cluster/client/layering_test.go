package client

import (
	"os/exec"
	"strings"
	"testing"
)

// The client side does not link the server: this package, the sidecar
// built on it and the sidecar's unix API import neither package cluster
// (the node) nor Raft. What they share with the node (frames, the admin
// JSON, the admin codes and their sentinels, the membership facts the
// admin client plans by) lives in cluster/wire.
func TestClientSideLinksNoServer(t *testing.T) {
	for _, pkg := range []string{"ticketing/cluster/client", "ticketing/sidecar", "ticketing/unixapi"} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 || deps[len(deps)-1] != pkg {
			t.Fatalf("go list -deps %s named %d packages, last %q", pkg, len(deps), deps[len(deps)-1])
		}
		for _, dep := range deps {
			if dep == "ticketing/cluster" || strings.HasPrefix(dep, "github.com/hashicorp/raft") ||
				strings.Contains(dep, "bolt") {
				t.Errorf("%s links %s (the node's side)", pkg, dep)
			}
		}
	}
}
