package floor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"ticketing/cluster"
)

// LibraryEntryBytes is the size of each entry the library floor applies:
// about one lock command.
const LibraryEntryBytes = 100

// LibraryNodes is the size of the library floor's cluster.
const LibraryNodes = 3

// maxLeaderChanges is how often leadership may move during the library
// floor before it gives up.
const maxLeaderChanges = 3

// LibraryFloor is what hashicorp/raft itself takes to commit: three
// in-process nodes over real loopback TCP (raft.NewTCPTransport), each
// with a durable store of the kind measured, a trivial FSM, and one
// goroutine on the leader applying LibraryEntryBytes entries one after
// another (raft.Apply, waiting for each).
type LibraryFloor struct {
	// LogStore is the kind of store (Bolt or WAL).
	LogStore string
	// Elapsed is how long the measured applies took, all together.
	Elapsed time.Duration
	// Commit holds each apply's latency: proposed on the leader until
	// committed by a majority and applied to the leader's FSM.
	Commit Quantiles
}

// Cycle is the floor under one client's acquire+release cycle: two
// commits in series (2 × the commit p50).
func (l LibraryFloor) Cycle() time.Duration { return 2 * l.Commit.P50 }

// Library measures the library floor for duration after a warm-up of a
// tenth of it, with the stores in subdirectories of dir.
func Library(ctx context.Context, kind, dir string, duration time.Duration) (res LibraryFloor, err error) {
	res.LogStore = kind
	var (
		rafts  []*raft.Raft
		stores []Store
		trans  []*raft.NetworkTransport
	)
	defer func() {
		for _, r := range rafts {
			_ = r.Shutdown().Error() // always nil in hashicorp/raft v1.7.3 (shutdownFuture.Error)
		}
		for _, t := range trans {
			t.Close()
		}
		for _, s := range stores {
			_ = s.Close() // a throwaway store in a temporary dir
		}
	}()
	var servers []raft.Server
	for i := range LibraryNodes {
		s, err := Open(kind, filepath.Join(dir, fmt.Sprintf("r%d", i+1)))
		if err != nil {
			return res, err
		}
		stores = append(stores, s)
		t, err := raft.NewTCPTransport("127.0.0.1:0", nil, 3, 10*time.Second, io.Discard)
		if err != nil {
			return res, fmt.Errorf("floor: transport: %w", err)
		}
		trans = append(trans, t)
		servers = append(servers, raft.Server{ID: raft.ServerID(fmt.Sprintf("f%d", i+1)), Address: t.LocalAddr()})
	}
	boot := raft.Configuration{Servers: servers}
	for i := range LibraryNodes {
		r, err := raft.NewRaft(libraryConfig(servers[i].ID), nopFSM{}, stores[i], stores[i], raft.NewDiscardSnapshotStore(), trans[i])
		if err != nil {
			return res, fmt.Errorf("floor: raft node %d: %w", i+1, err)
		}
		rafts = append(rafts, r)
		if err := r.BootstrapCluster(boot).Error(); err != nil {
			return res, fmt.Errorf("floor: bootstrap node %d: %w", i+1, err)
		}
	}
	leader, err := waitLeader(ctx, rafts, 30*time.Second)
	if err != nil {
		return res, err
	}
	entry := make([]byte, LibraryEntryBytes)
	changes := 0
	// apply applies one entry; ok is false when leadership moved meanwhile
	// (a CPU-starved leader on a shared box): that apply is not counted
	// and the next goes to the new leader, at most maxLeaderChanges times.
	apply := func() (d time.Duration, ok bool, err error) {
		t0 := time.Now()
		err = leader.Apply(entry, 10*time.Second).Error()
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			if changes++; changes > maxLeaderChanges {
				return 0, false, fmt.Errorf("floor: leadership moved %d times: %w", changes, err)
			}
			leader, err = waitLeader(ctx, rafts, 30*time.Second)
			return 0, false, err
		}
		if err != nil {
			return 0, false, fmt.Errorf("floor: apply: %w", err)
		}
		return time.Since(t0), true, nil
	}
	for end := time.Now().Add(duration / 10); time.Now().Before(end) && ctx.Err() == nil; {
		if _, _, err := apply(); err != nil {
			return res, err
		}
	}
	var lat []time.Duration
	t0 := time.Now()
	for end := t0.Add(duration); time.Now().Before(end) && ctx.Err() == nil; {
		d, ok, err := apply()
		if err != nil {
			return res, err
		}
		if ok {
			lat = append(lat, d)
		}
	}
	res.Elapsed = time.Since(t0)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if len(lat) == 0 {
		return res, errors.New("floor: no apply completed")
	}
	res.Commit = quantiles(lat)
	return res, nil
}

// libraryConfig is a node's Raft configuration: exactly a Ticketing
// node's at its defaults (cluster.RaftConfig, the one place it is built,
// so the floor cannot drift from the node it is compared with), with no
// log output.
func libraryConfig(id raft.ServerID) *raft.Config {
	rc := cluster.RaftConfig(cluster.DefaultConfig(), string(id))
	rc.Logger = hclog.NewNullLogger()
	return rc
}

// waitLeader waits until one of rafts is the leader and returns it.
func waitLeader(ctx context.Context, rafts []*raft.Raft, timeout time.Duration) (*raft.Raft, error) {
	deadline := time.Now().Add(timeout)
	for {
		for _, r := range rafts {
			if r.State() == raft.Leader {
				return r, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("floor: no leader within %v", timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// nopFSM is the trivial state machine: it applies nothing and snapshots
// nothing.
type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nopSnapshot{}, nil }
func (nopFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

type nopSnapshot struct{}

func (nopSnapshot) Persist(sink raft.SnapshotSink) error { return sink.Close() }
func (nopSnapshot) Release()                             {}
