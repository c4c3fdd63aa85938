package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// benchCatchup measures how long a new learner takes to catch up with a
// cluster holding keys locks: an in-process cluster of three voters and a
// spare node, keys acquired (lease 250 s) through pipelined connections,
// a snapshot taken and the log compacted so the learner is sent the
// snapshot, then the spare added as a learner and timed until its applied
// index reaches the leader's commit index.
func benchCatchup(ctx context.Context, dir string, keys int, out io.Writer) error {
	secret := []byte("bench-admin-secret-0123456789abcdef")
	c, err := local.Start(local.Options{Dir: filepath.Join(dir, "catchup"), Nodes: 4, Voters: 3, AdminSecret: secret,
		Tune: func(cfg *cluster.Config) {
			cfg.TrailingLogs = 8 // a learner this far behind gets the snapshot
			cfg.SnapshotThreshold = 1 << 30
			cfg.MaxKeys = max(cfg.MaxKeys, keys+1000)
		}})
	if err != nil {
		return err
	}
	defer c.Close()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	li, err := c.Leader(wctx)
	cancel()
	if err != nil {
		return err
	}
	leader := c.Node(li)

	// Fill: 4 connections, each with up to 1024 acquires in flight. An
	// acquire lost to a leader change (U, M) is simply tried again in the
	// next pass (a key already held by "filler" answers B).
	start := time.Now()
	for pass := 0; pass < 5; pass++ {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		li, err = c.Leader(wctx)
		cancel()
		if err != nil {
			return err
		}
		leader = c.Node(li)
		var missing []int
		leader.ReadState(func(st *lockState) {
			for k := 0; k < keys; k++ {
				if _, ok := st.Holder(fmt.Sprintf("seat/%09d", k)); !ok {
					missing = append(missing, k)
				}
			}
		})
		if len(missing) == 0 {
			break
		}
		if err := fillKeys(ctx, c.ClientAddr(li), c.ClientSecret, c.ClusterID, missing); err != nil {
			return err
		}
	}
	fill := time.Since(start)
	var held int
	leader.ReadState(func(st *lockState) { held = st.NumHeld() })
	if held < keys {
		return fmt.Errorf("only %d of %d keys held after five passes", held, keys)
	}
	fmt.Fprintf(out, "catchup: %d keys held, filled in %v (%.0f acquires/s)\n", held, fill.Round(time.Millisecond),
		float64(keys)/fill.Seconds())

	snapStart := time.Now()
	if err := leader.Raft().Snapshot().Error(); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	snapTook := time.Since(snapStart)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)

	spare := c.Node(3)
	commit := leader.Raft().CommitIndex()
	addStart := time.Now()
	if err := leader.AddLearner(spare.ServerID(), c.PeerAddrOf(3), time.Minute); err != nil {
		return err
	}
	for spare.Raft().AppliedIndex() < commit {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(5 * time.Millisecond)
	}
	catchup := time.Since(addStart)
	var learnerHeld int
	spare.ReadState(func(st *lockState) { learnerHeld = st.NumHeld() })
	fmt.Fprintf(out, "catchup: leader snapshot of %d keys in %v; learner caught up (applied %d >= commit %d, %d keys) in %v\n",
		held, snapTook.Round(time.Millisecond), spare.Raft().AppliedIndex(), commit, learnerHeld, catchup.Round(time.Millisecond))
	fmt.Fprintf(out, "catchup: Go heap of this process (4 nodes in one process) after GC: %d MiB\n", ms.HeapAlloc>>20)
	if fill+catchup > 240*time.Second {
		fmt.Fprintln(out, "catchup: warning: filling and catching up took longer than the 250 s leases; expiries were part of the work")
	}
	return nil
}

type lockState = locksm.State

// fillKeys acquires seat/<k> for every k through 4 pipelined connections;
// replies other than G are left for the caller's next pass.
func fillKeys(ctx context.Context, addr string, secret []byte, clusterID string, ks []int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := client.Dial(dctx, addr, client.Config{Secret: secret, ClusterID: clusterID})
		dcancel()
		if err != nil {
			return err
		}
		defer conn.Close()
		sem := make(chan struct{}, 1024)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var inner sync.WaitGroup
			for {
				i := next.Add(1) - 1
				if i >= int64(len(ks)) {
					break
				}
				sem <- struct{}{}
				call, err := conn.Start(wire.Msg{Type: wire.TypeAcquire, Key: fmt.Sprintf("seat/%09d", ks[i]), Owner: "filler", Lease: 250})
				if err != nil {
					<-sem
					break // connection gone: the next pass retries
				}
				inner.Add(1)
				go func() {
					defer inner.Done()
					<-call.Done
					<-sem
				}()
			}
			inner.Wait()
		}()
	}
	wg.Wait()
	return nil
}
