// The caller's side of a ghost grant, end to end: an event server's unix
// connection to the sidecar (unixapi, a real unix socket), the broker, and
// three real nodes of version 7 over TCP. In the external test package so
// that it can import unixapi, which imports sidecar.
package sidecar_test

import (
	"bufio"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/netfault"
	"ticketing/cluster/obs"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// unixLine is a raw unix API connection.
type unixLine struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialUnix(t *testing.T, path string) *unixLine {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &unixLine{t: t, c: c, br: bufio.NewReader(c)}
}

func (u *unixLine) send(line string) {
	u.t.Helper()
	u.c.SetWriteDeadline(time.Now().Add(15 * time.Second))
	if _, err := u.c.Write([]byte(line + "\n")); err != nil {
		u.t.Fatal(err)
	}
}

// read reads one reply line; wait bounds it (a hang guard).
func (u *unixLine) read(wait time.Duration) string {
	u.t.Helper()
	u.c.SetReadDeadline(time.Now().Add(wait))
	l, err := u.br.ReadString('\n')
	if err != nil {
		u.t.Fatalf("read: %v (got %q)", err, l)
	}
	return strings.TrimSuffix(l, "\n")
}

// counterSum is the sum of every series of the counter name in g.
func counterSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func counter(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok, err := obs.Value(g, name, labels...)
	if err != nil || !ok {
		t.Fatalf("no series %s%v (%v)", name, labels, err)
	}
	return v
}

// A ghost grant of a caller whose unix connection closed, on the same
// leader: the ACQUIRE commits, its G is lost with the broker's cluster
// connection, the broker's resume is held back (netfault.Frames) until
// the caller's unix connection has closed and the broker has given the
// acquire up; then the resume, on the same leader, answers the recorded
// grant, and the broker releases it at once by its token. Another unix
// caller gets the key with a larger token within a wait much shorter than
// the ghost's lease: released, not left to its lease.
func TestE2EGhostGrantOfClosedUnixCallerIsReleased(t *testing.T) {
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), Tune: func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		cfg.ProtocolVersion = 7
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	li, err := c.Leader(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu        sync.Mutex
		ghostConn uint64
		ghostID   uint64
		ghost     uint64 // the token whose G was lost
		holdY     = true
		resumes   []netfault.Frame
	)
	lost, yHeld := make(chan struct{}), make(chan struct{}, 1)
	f := netfault.NewFrames(func(fr netfault.Frame) netfault.Verdict {
		mu.Lock()
		defer mu.Unlock()
		m := fr.Msg
		switch {
		case fr.Dir == netfault.Sent && m.Type == wire.TypeAcquire && m.Key == "k" && ghostID == 0:
			ghostConn, ghostID = fr.Conn, m.ID
		case fr.Dir == netfault.Received && m.Type == wire.TypeGranted && fr.Conn == ghostConn && m.ID == ghostID && ghost == 0:
			ghost = m.Token
			close(lost)
			return netfault.Cut // the G is lost with its connection
		case fr.Dir == netfault.Sent && m.Type == wire.TypeResume:
			if holdY {
				select {
				case yHeld <- struct{}{}:
				default:
				}
				return netfault.Hold
			}
			resumes = append(resumes, fr)
		}
		return netfault.Pass
	})
	cfg := sidecar.DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.ClusterID, cfg.Dialer = c.ClientAddrs(), c.ClientSecret, c.ClusterID, f.Dial
	cfg.Logger = slog.New(slog.DiscardHandler)
	b, err := sidecar.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	testkit.WaitFor(t, "the cluster session attached to the leader", 20*time.Second, func() bool {
		in := b.Info()
		return in.Leader == c.ClientAddr(li) && in.Session != nil && in.Session.State == "attached"
	})
	dir, err := os.MkdirTemp("", "ux") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ucfg := unixapi.DefaultConfig()
	ucfg.Path, ucfg.Logger = filepath.Join(dir, "s"), cfg.Logger
	srv, err := unixapi.Listen(ucfg, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })

	const lease = 60
	caller := dialUnix(t, srv.Path())
	caller.send("ACQUIRE k " + strconv.Itoa(lease) + " 20")
	select {
	case <-lost:
	case <-time.After(30 * time.Second):
		t.Fatal("the acquire's G never came")
	}
	mu.Lock()
	token := ghost
	mu.Unlock()
	var h locksm.Holder
	var held bool
	c.Node(li).ReadState(func(st *locksm.State) { h, held = st.Holder("k") })
	if !held || h.Token != token {
		t.Fatalf("the ghost grant should have committed under token %d: %+v %v", token, h, held)
	}
	select {
	case <-yHeld: // the broker saw its connection lost and tries to resume
	case <-time.After(30 * time.Second):
		t.Fatal("the broker never tried to resume")
	}
	if si := b.Info().Session; si.Held != 1 {
		t.Fatalf("session %+v, want the ghost's acquire held for the resume", si)
	}

	// The caller goes away before the resume: its ACQUIRE is given up.
	reg := b.MetricsRegistry()
	caller.c.Close()
	testkit.WaitFor(t, "the caller's acquire given up", 30*time.Second, func() bool {
		return counterSum(t, reg, "ticketing_sidecar_acquires_total") == 1
	})
	if v := counter(t, reg, "ticketing_sidecar_acquires_total", "result", "granted"); v != 0 {
		t.Fatalf("%v acquires reported granted, want the caller's given up", v)
	}

	mu.Lock()
	holdY = false
	mu.Unlock()
	f.Release()
	testkit.WaitFor(t, "the cluster session resumed", 30*time.Second, func() bool {
		si := b.Info().Session
		return si != nil && si.State == "attached" && si.Resumes >= 1
	})
	mu.Lock()
	for _, y := range resumes {
		if y.Addr != c.ClientAddr(li) {
			t.Errorf("resumed at %s, want the same leader %s", y.Addr, c.ClientAddr(li))
		}
	}
	mu.Unlock()

	// The key is free long before the ghost's 60 s lease would have ended
	// it: another caller waiting 20 s gets it.
	next := dialUnix(t, srv.Path())
	next.send("ACQUIRE k " + strconv.Itoa(lease) + " 20")
	reply := next.read(60 * time.Second)
	f2 := strings.Fields(reply)
	if len(f2) != 2 || f2[0] != "OK" {
		t.Fatalf("another caller, waiting 20 s for a key whose ghost holds a %d s lease: %q", lease, reply)
	}
	if tok, err := strconv.ParseUint(f2[1], 10, 64); err != nil || tok <= token {
		t.Fatalf("token %q after the ghost's %d", f2[1], token)
	}
	if si := b.Info().Session; si.LastResume.Outcomes < 1 {
		t.Errorf("the resume answered %+v, want the ghost's outcome", si.LastResume)
	}
	if v := counter(t, reg, "ticketing_sidecar_late_grants_total"); v != 1 {
		t.Errorf("late grants %v, want 1", v)
	}
	testkit.WaitFor(t, "the compensation counted", 10*time.Second, func() bool {
		return counter(t, reg, "ticketing_sidecar_compensations_total", "result", "ok") == 1
	})
}
