package floor

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster"
)

// TestFloors measures both floors briefly on each log store and checks
// that they report what they measured (no figure is checked against a
// speed).
func TestFloors(t *testing.T) {
	for _, kind := range LogStores {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			d, err := Disk(ctx, kind, t.TempDir(), 3, 200*time.Millisecond)
			if err != nil {
				t.Fatalf("disk: %v", err)
			}
			if d.LogStore != kind || d.Stores != 3 || d.Append.N < 3 || d.Append.P50 <= 0 || d.Append.P99 < d.Append.P50 ||
				d.Commit() != 2*d.Append.P50 || d.HandoffsPerS() <= 0 || d.CyclesPerS(64) <= 0 {
				t.Errorf("disk floor %+v", d)
			}
			l, err := Library(ctx, kind, t.TempDir(), 300*time.Millisecond)
			if err != nil {
				t.Fatalf("library: %v", err)
			}
			if l.LogStore != kind || l.Commit.N == 0 || l.Commit.P50 <= 0 || l.Commit.P99 < l.Commit.P50 || l.Cycle() != 2*l.Commit.P50 || l.Elapsed <= 0 {
				t.Errorf("library floor %+v", l)
			}
		})
	}
	if _, err := Open("lsm", t.TempDir()); err == nil {
		t.Error("Open accepted an unknown log store")
	}
}

// The library floor runs hashicorp/raft with a Ticketing node's own Raft
// configuration (cluster.RaftConfig), not a copy that could drift: every
// field but the logger is the node's at its defaults.
func TestLibraryConfigIsTheNodes(t *testing.T) {
	got := *libraryConfig("f1")
	want := *cluster.RaftConfig(cluster.DefaultConfig(), "f1")
	got.Logger, want.Logger = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("library floor's Raft config\n%+v\ndiffers from a node's\n%+v", got, want)
	}
	// And the node's differs from the library's defaults (else the check
	// above would prove nothing).
	lib := *raft.DefaultConfig()
	lib.LocalID, lib.Logger = "f1", nil
	if reflect.DeepEqual(lib, want) {
		t.Fatal("a node's Raft config is hashicorp/raft's default")
	}
}
