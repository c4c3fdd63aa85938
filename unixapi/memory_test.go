package unixapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// The waiting-room memory measurement: what one waiting ACQUIRE costs the
// sidecar (broker and unix API together), with the cluster in another
// process so that its memory is not counted.
//
//	go test -run '^$' -bench BenchmarkWaiterMemory -benchtime 1x ./unixapi/
//
// (UNIXAPI_BENCH_WAITERS=50000 for a bigger room).
//
// It reports heap+stack bytes and goroutines per waiter, measured with
// runtime.MemStats (HeapInuse+StackInuse, after a GC) before the waiters
// and once all of them are queued at the leader.

// childClusterEnv makes the test binary run a cluster instead of tests
// (TestMain): the parent of a measurement starts it.
const childClusterEnv = "UNIXAPI_CHILD_CLUSTER"

type childInfo struct {
	Addrs     []string
	Secret    []byte
	ClusterID string
}

// runChildCluster runs a local cluster in this process until stdin closes,
// after printing how to reach it as one JSON line.
func runChildCluster(dir string) int {
	c, err := local.Start(local.Options{Dir: dir, Logger: testLogger(), Tune: func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		cfg.MaxWaitersPerKey = 1 << 20 // a waiting room of any size the benchmark asks for
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Leader(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = json.NewEncoder(os.Stdout).Encode(childInfo{Addrs: c.ClientAddrs(), Secret: c.ClientSecret, ClusterID: c.ClusterID})
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// startChildCluster starts a cluster in a child process of the test binary.
func startChildCluster(tb testing.TB) childInfo {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childClusterEnv+"="+tb.TempDir())
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = in.Close(); _ = cmd.Wait() })
	var ci childInfo
	if err := json.NewDecoder(bufio.NewReader(out)).Decode(&ci); err != nil {
		tb.Fatalf("child cluster: %v", err)
	}
	return ci
}

// inUse is the heap and stack in use after a collection.
func inUse() (bytes int64, goroutines int) {
	var m runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse), runtime.NumGoroutine()
}

func BenchmarkWaiterMemory(b *testing.B) {
	// 4000 waiters by default: within every limit of the code before
	// issue 20 too, so that the figures compare. UNIXAPI_BENCH_WAITERS asks
	// for another number (spread over the 20 connections).
	conns, perConn := 20, 200
	if n, err := strconv.Atoi(os.Getenv("UNIXAPI_BENCH_WAITERS")); err == nil && n >= conns {
		perConn = n / conns
	}
	m := measureWaiterMemory(b, conns, perConn)
	b.ReportMetric(m.bytesPer(), "B/waiter")
	b.ReportMetric(float64(m.goroutines)/float64(m.waiters), "goroutines/waiter")
	b.Logf("%s", m)
	for range b.N {
	}
}

// waiterMemory is what measureWaiterMemory measured.
type waiterMemory struct {
	waiters        int
	bytes          int64 // heap+stack in use, after less before
	g0, goroutines int   // goroutines before, and how many more after
}

func (m waiterMemory) bytesPer() float64 { return float64(m.bytes) / float64(m.waiters) }

func (m waiterMemory) String() string {
	return fmt.Sprintf("%d waiting ACQUIREs: heap+stack %+d KiB (%.0f B per waiter), goroutines %d -> %d",
		m.waiters, m.bytes>>10, m.bytesPer(), m.g0, m.g0+m.goroutines)
}

// measureWaiterMemory queues conns*perConn waiting ACQUIREs of one held key
// through a broker and a server of this process, with the cluster in a
// child process (so that only the sidecar's memory counts), and measures
// what they cost once the leader has queued every one.
func measureWaiterMemory(tb testing.TB, conns, perConn int) waiterMemory {
	tb.Helper()
	ci := startChildCluster(tb)
	bcfg := sidecar.DefaultConfig()
	bcfg.Addrs, bcfg.Secret, bcfg.ClusterID, bcfg.Logger = ci.Addrs, ci.Secret, ci.ClusterID, testLogger()
	br, err := sidecar.New(bcfg)
	if err != nil {
		tb.Fatal(err)
	}
	defer br.Close()
	ucfg := unixapi.DefaultConfig()
	ucfg.Path, ucfg.Logger = sockPath(tb), testLogger()
	s, err := unixapi.Listen(ucfg, br)
	if err != nil {
		tb.Fatal(err)
	}
	defer s.Close()
	holder := dialB(tb, s)
	testkit.WaitFor(tb, "the broker to learn a leader", 20*time.Second, func() bool { return br.Info().Leader != "" })
	// The leader's status counts the waiters.
	var leader *client.Conn
	for _, a := range ci.Addrs {
		c, err := client.Dial(context.Background(), a, client.Config{Secret: ci.Secret, ClusterID: ci.ClusterID})
		if err != nil {
			tb.Fatal(err)
		}
		defer c.Close()
		if st, _, err := c.Do(context.Background(), wire.Msg{Type: wire.TypeStatus}); err == nil && st.Role == wire.RoleLeader {
			leader = c
		}
	}
	if leader == nil {
		tb.Fatal("no leader among the nodes")
	}
	waiting := func() uint64 {
		st, _, err := leader.Do(context.Background(), wire.Msg{Type: wire.TypeStatus})
		if err != nil {
			tb.Fatal(err)
		}
		return st.Waiting
	}
	const hot = "memory/hot"
	holder.send("ACQUIRE " + hot + " 250 0")
	if r := holder.read(); !strings.HasPrefix(r, "OK ") {
		tb.Fatalf("holder: %q", r)
	}
	cs := make([]*bconn, conns)
	for i := range cs {
		cs[i] = dialB(tb, s)
		cs[i].send("PING")
		if r := cs[i].read(); r != "PONG" {
			tb.Fatalf("conn %d: %q", i, r)
		}
	}
	base := waiting()
	m0, g0 := inUse()
	lines := strings.Repeat("ACQUIRE "+hot+" 250 300\n", perConn)
	for _, c := range cs {
		c.write(lines)
	}
	n := conns * perConn
	testkit.WaitFor(tb, fmt.Sprintf("%d waiters queued at the leader", n), 60*time.Second, func() bool { return waiting() >= base+uint64(n) })
	m1, g1 := inUse()
	return waiterMemory{waiters: n, bytes: m1 - m0, g0: g0, goroutines: g1 - g0}
}

// bconn is conn for a benchmark.
type bconn struct {
	tb testing.TB
	c  net.Conn
	br *bufio.Reader
}

func dialB(tb testing.TB, s *unixapi.Server) *bconn {
	tb.Helper()
	c, err := net.Dial("unix", s.Path())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return &bconn{tb: tb, c: c, br: bufio.NewReader(c)}
}

func (c *bconn) write(s string) {
	c.c.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(c.c, s); err != nil {
		c.tb.Fatal(err)
	}
}

func (c *bconn) send(line string) { c.write(line + "\n") }

func (c *bconn) read() string {
	c.c.SetDeadline(time.Now().Add(15 * time.Second))
	l, err := c.br.ReadString('\n')
	if err != nil {
		c.tb.Fatalf("read: %v (%q)", err, l)
	}
	return strings.TrimSuffix(l, "\n")
}
