package local

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// A cluster created on free ports (BasePort 0) restarts from its Dir on
// the same ports: its Raft configuration names them. Other ports, or
// another size, are refused with ErrAddrsChanged.
func TestRestartKeepsFreePorts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "c")
	c, err := Start(Options{Dir: dir, Tune: FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	first := c.ClientAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	domain := c.Domain
	c.Close()

	c, err = Start(Options{Dir: dir, Tune: FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, a := range c.ClientAddrs() {
		if a != first[i] {
			t.Fatalf("restart: node %d on %s, first on %s", i, a, first[i])
		}
	}
	li, err := c.Leader(ctx)
	if err != nil {
		t.Fatalf("restarted cluster: %v", err)
	}
	if c.Domain != "" || c.Node(li).Domain() != domain {
		t.Fatalf("restart made a new domain: %q %q, want %q", c.Domain, c.Node(li).Domain(), domain)
	}
	c.Close()

	for _, opts := range []Options{{Dir: dir, BasePort: 17400}, {Dir: dir, Nodes: 5}} {
		if c, err := Start(opts); !errors.Is(err, ErrAddrsChanged) {
			if c != nil {
				c.Close()
			}
			t.Fatalf("Start(%+v): %v, want ErrAddrsChanged", opts, err)
		}
	}
}
