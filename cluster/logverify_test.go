package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// corrupter is a test log store that, once armed, corrupts one entry of
// its node that target picks, by flipping the last bit of its data:
// onStore, as the node stores it (between Raft and the log verifier:
// what the node wrote differs from what the leader wrote, as if it had
// been altered on the way); otherwise as the node reads it back (between
// the verifier and the store: the node's storage returns something else,
// at every read of that index). Raft's log cache keeps the entry it was
// given, so the state machine applies the leader's bytes either way.
type corrupter struct {
	raft.LogStore
	onStore bool
	target  func(*raft.Log) bool
	armed   atomic.Bool
	at      atomic.Uint64 // the index corrupted; 0: none yet
}

func (c *corrupter) IsMonotonic() bool {
	m, ok := c.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func flipLastBit(l *raft.Log) *raft.Log {
	cp := *l
	cp.Data = bytes.Clone(l.Data)
	cp.Data[len(cp.Data)-1] ^= 1
	return &cp
}

func (c *corrupter) GetLog(i uint64, l *raft.Log) error {
	if err := c.LogStore.GetLog(i, l); err != nil {
		return err
	}
	if !c.onStore && c.armed.Load() && c.target(l) && (c.at.CompareAndSwap(0, i) || c.at.Load() == i) {
		*l = *flipLastBit(l)
	}
	return nil
}

func (c *corrupter) StoreLog(l *raft.Log) error { return c.StoreLogs([]*raft.Log{l}) }

func (c *corrupter) StoreLogs(logs []*raft.Log) error {
	if c.onStore && c.armed.Load() && c.at.Load() == 0 {
		for i, l := range logs {
			if c.target(l) && c.at.CompareAndSwap(0, l.Index) {
				logs = slices.Clone(logs)
				logs[i] = flipLastBit(l)
				break
			}
		}
	}
	return c.LogStore.StoreLogs(logs)
}

func entryOfKind(kind byte) func(*raft.Log) bool {
	return func(l *raft.Log) bool { return l.Type == raft.LogCommand && len(l.Data) > 1 && l.Data[0] == kind }
}

// verifyMetric is ticketing_node_log_verifications_total{result} of node i.
func verifyMetric(t *testing.T, c *testCluster, i int, result string) float64 {
	t.Helper()
	v, _ := lookupMetric(t, c.Node(i).MetricsRegistry(), "ticketing_node_log_verifications_total", "result", result)
	return v
}

// Online log verification on real nodes over TCP: one follower's copy of
// an entry is corrupted, as it stores it (in flight) or as it reads it
// back (storage); that follower, and only it, reports it with the right
// result and an error log naming a range that holds the entry, and every
// node's lock table stays the same. With verification off, the same
// corruption of an entry goes unnoticed.
func TestLogVerification(t *testing.T) {
	for _, tc := range []struct {
		name    string
		onStore bool
		kind    byte // the kind of entry corrupted
		off     bool
		want    string // the result reported
		logged  string
	}{
		// A checkpoint read back: the state machine never reads the
		// payload, so nothing but the verifier could notice.
		{name: "storage", kind: cluster.CheckpointKind, want: "storage_corruption", logged: "storage corruption"},
		{name: "in-flight", onStore: true, kind: 'L', want: "in_flight_corruption", logged: "in-flight corruption"},
		{name: "off", onStore: true, kind: 'L', off: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testLogVerification(t, tc.onStore, tc.kind, tc.off, tc.want, tc.logged)
		})
	}
}

func testLogVerification(t *testing.T, onStore bool, kind byte, off bool, want, logged string) {
	var (
		mu    sync.Mutex
		corr  = map[string]*corrupter{}
		logs  = map[string]*syncBuffer{}
		store = cluster.LogStoreWAL
	)
	if kind == 'L' {
		store = cluster.LogStoreBolt // the wrapper works over both kinds
	}
	c := startClusterOpts(t, local.Options{LogStore: store, Tune: func(cfg *cluster.Config) {
		cr := &corrupter{onStore: onStore, target: entryOfKind(kind)}
		buf := &syncBuffer{}
		mu.Lock()
		corr[cfg.NodeID], logs[cfg.NodeID] = cr, buf
		mu.Unlock()
		cfg.Logger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
		wrap := func(s raft.LogStore) raft.LogStore { cr.LogStore = s; return cr }
		if onStore {
			cluster.WrapLogStore(cfg, nil, wrap)
		} else {
			cluster.WrapLogStore(cfg, wrap, nil)
		}
		cfg.DisableLogVerify = off
		cfg.LogVerifyInterval = 100 * time.Millisecond
		cfg.LogVerifyEntries = 64
	}})
	li := c.leader()
	fi := (li + 1) % c.Size()
	for i := range c.Size() {
		testkit.WaitFor(t, "the cluster version", 10*time.Second, func() bool { return c.Node(i).ClusterVersion() == wire.ProtocolVersion })
	}

	// A steady trickle of lock entries: acquire and release, key by key.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		lc := c.client()
		defer lc.close()
		for k := 0; ctx.Err() == nil; k++ {
			key := fmt.Sprintf("verify/%d", k%50)
			r := lc.do(acquireMsg(key, "o", 30, 0))
			if r.Type == wire.TypeGranted {
				lc.do(releaseMsg(key, "o", r.Token))
			}
		}
	}()
	stopLoad := func() {
		cancel()
		<-done
	}
	defer stopLoad()

	f := corr[c.ID(fi)]
	if !off {
		// The follower has checked a range: its running sum now starts
		// where the leader's does.
		testkit.WaitFor(t, "a verified range on the follower", 20*time.Second, func() bool { return verifyMetric(t, c, fi, "ok") > 0 })
	}
	f.armed.Store(true)
	testkit.WaitFor(t, "the corruption", 20*time.Second, func() bool { return f.at.Load() != 0 })
	at := f.at.Load()
	if off {
		// Give verification every chance to notice, were it on.
		time.Sleep(time.Second)
	} else {
		testkit.WaitFor(t, want+" reported", 20*time.Second, func() bool { return verifyMetric(t, c, fi, want) > 0 })
	}
	stopLoad()

	for i := range c.Size() {
		id := c.ID(i)
		out := logs[id].String()
		for _, r := range []string{"storage_corruption", "in_flight_corruption"} {
			if got := verifyMetric(t, c, i, r); (i == fi && r == want) != (got > 0) {
				t.Errorf("%s (follower %v): %s = %v", id, i == fi, r, got)
			}
		}
		if n := strings.Count(out, "LOG VERIFICATION FAILED"); (i == fi && !off) != (n > 0) {
			t.Errorf("%s (follower %v): %d verification failures logged:\n%s", id, i == fi, n, out)
		}
		cps, _ := lookupMetric(t, c.Node(i).MetricsRegistry(), "ticketing_node_log_checkpoints_total")
		if off {
			if ok := verifyMetric(t, c, i, "ok"); ok != 0 || cps != 0 {
				t.Errorf("%s: verification off, yet %v ranges verified and %v checkpoints appended", id, ok, cps)
			}
			continue
		}
		if ok := verifyMetric(t, c, i, "ok"); ok == 0 {
			t.Errorf("%s: no range verified", id)
		}
		if i == li && cps == 0 {
			t.Errorf("%s: the leader appended no checkpoint", id)
		}
	}
	if !off {
		// The error log names the range that holds the corrupted entry.
		line := ""
		for _, l := range strings.Split(logs[c.ID(fi)].String(), "\n") {
			if strings.Contains(l, "LOG VERIFICATION FAILED: "+logged) {
				line = l
				break
			}
		}
		m := regexp.MustCompile(`first_index=(\d+) last_index=(\d+)`).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("no %q error with its index range:\n%s", logged, logs[c.ID(fi)].String())
		}
		first, _ := strconv.ParseUint(m[1], 10, 64)
		last, _ := strconv.ParseUint(m[2], 10, 64)
		if at < first || at > last {
			t.Errorf("the error names [%d, %d], the corrupted entry is %d: %s", first, last, at, line)
		}
		t.Logf("entry %d corrupted; %s", at, line)
	}

	// Verification never touches lock state: every node's table is the
	// same once they have applied everything.
	want0 := tableOf(t, c, li)
	for i := range c.Size() {
		testkit.WaitFor(t, "the nodes converge", 10*time.Second, func() bool {
			return c.Node(i).Raft().AppliedIndex() >= c.Node(li).Raft().CommitIndex() && bytes.Equal(tableOf(t, c, i), want0)
		})
	}
}

// tableOf is node i's lock table as a snapshot.
func tableOf(t *testing.T, c *testCluster, i int) []byte {
	t.Helper()
	var b bytes.Buffer
	var err error
	c.Node(i).ReadState(func(st *locksm.State) { err = st.WriteSnapshot(&b) })
	if err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Mixed versions: while a member speaks version 9 (the cluster version
// stays 9), the leader appends no checkpoint, whatever its own version:
// a version 9 build would not know the entry. Every node still runs
// its verifier and counts nothing.
func TestLogVerificationWaitsForTheClusterVersion(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) {
		if cfg.NodeID == "n3" {
			cfg.ProtocolVersion = wire.VersionLogVerify - 1
		}
		cfg.LogVerifyInterval = 50 * time.Millisecond
		cfg.LogVerifyEntries = 16
	}})
	li := c.leader()
	lc := c.client()
	defer lc.close()
	deadline := time.Now().Add(time.Second)
	for k := 0; time.Now().Before(deadline); k++ {
		key := fmt.Sprintf("mixed/%d", k%20)
		if r := lc.do(acquireMsg(key, "o", 30, 0)); r.Type == wire.TypeGranted {
			lc.do(releaseMsg(key, "o", r.Token))
		}
	}
	for i := range c.Size() {
		if v := c.Node(i).ClusterVersion(); v != wire.VersionLogVerify-1 {
			t.Fatalf("%s: cluster version %d, want %d", c.ID(i), v, wire.VersionLogVerify-1)
		}
		n, err := cluster.EntriesOfKind(c.Node(i), cluster.CheckpointKind)
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%s: %d checkpoints in the log at cluster version %d", c.ID(i), n, wire.VersionLogVerify-1)
		}
		for _, r := range []string{"ok", "storage_corruption", "in_flight_corruption", "unverified"} {
			if v := verifyMetric(t, c, i, r); v != 0 {
				t.Errorf("%s: %s = %v", c.ID(i), r, v)
			}
		}
	}
	if n, _ := lookupMetric(t, c.Node(li).MetricsRegistry(), "ticketing_node_log_checkpoints_total"); n != 0 {
		t.Errorf("the leader appended %v checkpoints", n)
	}
}
