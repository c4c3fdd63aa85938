package cluster_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/netfault"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

type testCluster struct {
	*local.Cluster
	t      *testing.T
	faults *netfault.Network
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("TICKETING_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func startCluster(t *testing.T, nodes int) *testCluster {
	t.Helper()
	return startClusterOpts(t, local.Options{Nodes: nodes})
}

// startClusterOpts starts a cluster with opts; Dir and (unless set)
// Logger and PeerNet are filled in, and Tune runs after local.FastRaft.
func startClusterOpts(t *testing.T, opts local.Options) *testCluster {
	t.Helper()
	faults := netfault.New()
	if opts.PeerNet == nil {
		opts.PeerNet = faults
	}
	tune := opts.Tune
	opts.Dir = t.TempDir()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	opts.Tune = func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		if tune != nil {
			tune(cfg)
		}
	}
	c, err := local.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &testCluster{Cluster: c, t: t, faults: faults}
}

func (c *testCluster) leader() int {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	i, err := c.Leader(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	return i
}

// dial connects to node i's client port.
func (c *testCluster) dial(i int) *client.Conn {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, c.ClientAddr(i), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID, TLS: c.ClientTLS})
	if err != nil {
		c.t.Fatalf("dial node %d: %v", i, err)
	}
	c.t.Cleanup(func() { conn.Close() })
	return conn
}

func do(t *testing.T, conn *client.Conn, m wire.Msg) wire.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, _, err := conn.Do(ctx, m)
	if err != nil {
		t.Fatalf("%c request: %v", m.Type, err)
	}
	return r
}

func acquireMsg(key, owner string, lease uint16, wait time.Duration) wire.Msg {
	return wire.Msg{Type: wire.TypeAcquire, Key: key, Owner: owner, Lease: lease, WaitMs: uint32(wait / time.Millisecond)}
}

func releaseMsg(key, owner string, token uint64) wire.Msg {
	return wire.Msg{Type: wire.TypeRelease, Key: key, Owner: owner, Token: token}
}

func mustGrant(t *testing.T, r wire.Msg) uint64 {
	t.Helper()
	if r.Type != wire.TypeGranted || r.Token == 0 {
		t.Fatalf("want G with a token, got %s", describe(r))
	}
	return r.Token
}

func mustType(t *testing.T, r wire.Msg, typ byte) {
	t.Helper()
	if r.Type != typ {
		t.Fatalf("want %c, got %s", typ, describe(r))
	}
}

func describe(r wire.Msg) string {
	switch r.Type {
	case wire.TypeError:
		return fmt.Sprintf("E(%s: %s)", r.Code, r.Text)
	case wire.TypeUnknown:
		return fmt.Sprintf("U(%s)", r.Text)
	case wire.TypeMoved:
		return fmt.Sprintf("M(%q %q)", r.LeaderID, r.LeaderAddr)
	case wire.TypeGranted:
		return fmt.Sprintf("G(%d)", r.Token)
	}
	return string(rune(r.Type))
}

// leaderClient sends requests to whichever node serves, following M and
// retrying only requests that were definitely not executed.
type leaderClient struct {
	t  *testing.T
	c  *testCluster
	mu sync.Mutex
	at int
	cn *client.Conn
}

func (c *testCluster) client() *leaderClient {
	return &leaderClient{t: c.t, c: c, at: -1}
}

// do sends m to the leader. It retries after M, or a failed dial/unwritten
// request; a written request that loses its connection returns U.
func (lc *leaderClient) do(m wire.Msg) wire.Msg {
	lc.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		conn, err := lc.conn()
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		r, written, err := conn.Do(ctx, m)
		cancel()
		if err != nil {
			lc.drop()
			if written {
				return wire.Msg{Type: wire.TypeUnknown, Text: err.Error()}
			}
			continue
		}
		if r.Type == wire.TypeMoved {
			lc.drop()
			lc.mu.Lock()
			lc.at = -1
			for i := 0; i < lc.c.Size(); i++ {
				if r.LeaderAddr != "" && lc.c.ClientAddr(i) == r.LeaderAddr {
					lc.at = i
				}
			}
			lc.mu.Unlock()
			if r.LeaderAddr == "" {
				time.Sleep(20 * time.Millisecond)
			}
			continue
		}
		return r
	}
	lc.t.Fatalf("no leader answered %c within 20s", m.Type)
	return wire.Msg{}
}

func (lc *leaderClient) conn() (*client.Conn, error) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.cn != nil {
		select {
		case <-lc.cn.Done():
			lc.cn = nil
		default:
			if !lc.cn.HandingOver() {
				return lc.cn, nil
			}
			// The node announced that it hands its leadership over: it
			// takes no more lock requests on this connection.
			lc.cn.Close()
			lc.cn = nil
		}
	}
	if lc.at < 0 {
		// Round-robin over the nodes until one names the leader.
		lc.at = int(time.Now().UnixNano() % int64(lc.c.Size()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cn, err := client.Dial(ctx, lc.c.ClientAddr(lc.at), client.Config{Secret: lc.c.ClientSecret, ClusterID: lc.c.ClusterID, TLS: lc.c.ClientTLS})
	if err != nil {
		lc.at = (lc.at + 1) % lc.c.Size()
		return nil, err
	}
	lc.cn = cn
	return cn, nil
}

func (lc *leaderClient) drop() {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.cn != nil {
		lc.cn.Close()
		lc.cn = nil
	}
}

func (lc *leaderClient) close() { lc.drop() }

// current is the connection the client holds now (nil: none).
func (lc *leaderClient) current() *client.Conn {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.cn
}

// handOffToBob queues bob (on b) behind alice, who holds seats/1 under t1
// (on a, at leader li); alice's release hands the key to bob in the same
// commit, with a larger token, and every node converges on it. It returns
// bob's token.
func handOffToBob(t *testing.T, c *testCluster, li int, a, b *client.Conn, t1 uint64) uint64 {
	t.Helper()
	call, err := b.Start(acquireMsg("seats/1", "bob", 30, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "bob queued", 5*time.Second, func() bool {
		var q int
		c.Node(li).ReadState(func(st *locksm.State) { q = len(st.Waiters("seats/1")) })
		return q == 1
	})
	mustType(t, do(t, a, releaseMsg("seats/1", "alice", t1)), wire.TypeOK)
	<-call.Done
	if call.Err != nil {
		t.Fatal(call.Err)
	}
	t2 := mustGrant(t, call.Reply)
	if t2 <= t1 {
		t.Fatalf("hand-off token %d not above %d", t2, t1)
	}
	c.converged("seats/1", locksm.Holder{Owner: "bob", Token: t2}, true)
	return t2
}

// snapshotIndex is the index of node i's latest snapshot (0: none).
func (c *testCluster) snapshotIndex(i int) uint64 {
	n, _ := strconv.ParseUint(c.Node(i).Raft().Stats()["last_snapshot_index"], 10, 64)
	return n
}

// restartFromOwnSnapshot has follower fi of leader li take a snapshot of
// what it applied and restart from it, and returns the applied index the
// snapshot covers: after it the node's state comes from the snapshot, and
// the log after it holds nothing applied before.
func (c *testCluster) restartFromOwnSnapshot(fi int) uint64 {
	t := c.t
	t.Helper()
	applied := c.Node(fi).Raft().AppliedIndex()
	if err := c.Node(fi).Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(fi); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(fi); err != nil {
		t.Fatal(err)
	}
	if si := c.snapshotIndex(fi); si < applied {
		t.Fatalf("restarted follower's snapshot index %d, before its applied index %d", si, applied)
	}
	return applied
}

// restoreByInstallSnapshot stops the follower that is neither li nor fi,
// grants on 30 keys and compacts the running nodes' logs past its last
// entry, and restarts it, so that it can only catch up by InstallSnapshot;
// it returns that follower once it has restored.
func (c *testCluster) restoreByInstallSnapshot(li, fi int) int {
	t := c.t
	t.Helper()
	fo := (fi + 1) % c.Size()
	if fo == li {
		fo = (fo + 1) % c.Size()
	}
	if err := c.Stop(fo); err != nil {
		t.Fatal(err)
	}
	behind := c.Node(li).Raft().LastIndex()
	lc := c.client()
	defer lc.close()
	var last uint64
	for i := 0; i < 30; i++ {
		last = mustGrant(t, lc.do(acquireMsg(fmt.Sprintf("fill/%d", i), "o", 200, 0)))
	}
	for _, i := range []int{li, fi} {
		testkit.WaitFor(t, "the running nodes applied every grant", 10*time.Second, func() bool {
			return c.Node(i).LastToken() == last
		})
		if err := c.Node(i).Raft().Snapshot().Error(); err != nil {
			t.Fatal(err)
		}
	}
	if first, err := cluster.LogFirstIndex(c.Node(li)); err != nil || first <= behind {
		t.Fatalf("the leader's first log index %d (%v), want above the stopped follower's %d", first, err, behind)
	}
	if err := c.Restart(fo); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the follower restored from an installed snapshot", 20*time.Second, func() bool {
		return c.Node(fo).LastToken() == last && c.snapshotIndex(fo) > behind
	})
	return fo
}
