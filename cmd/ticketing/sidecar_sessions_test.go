package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/locksm"
)

// syncBuffer is a bytes.Buffer safe for a process's writes and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// sessionCluster starts three in-process nodes that speak cluster
// protocol version 7 (sessions), which the node binary does not yet do
// by default.
func sessionCluster(t *testing.T) *local.Cluster {
	t.Helper()
	c, err := local.Start(local.Options{Dir: t.TempDir(), Tune: func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		cfg.ProtocolVersion = 7
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sidecarProc is a `ticketing sidecar` process.
type sidecarProc struct {
	cmd    *exec.Cmd
	sock   string
	stderr *syncBuffer
	done   chan struct{}
}

// startSidecarProc runs the real binary's sidecar on c with args added,
// on a fresh socket; it is stopped (SIGTERM) when the test ends.
func startSidecarProc(t *testing.T, c *local.Cluster, args ...string) *sidecarProc {
	t.Helper()
	dir, err := os.MkdirTemp("", "tkss")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &sidecarProc{sock: filepath.Join(dir, "s"), stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(binary, append([]string{"sidecar", "--cluster", strings.Join(c.ClientAddrs(), ","),
		"--secret-file", c.SecretFile, "--cluster-id", c.ClusterID, "--socket", p.sock}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.stderr, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("sidecar output:\n%s", p.stderr.String())
		}
	})
	return p
}

// info is the sidecar's INFO line (`ticketing info`) split into its
// fields; nil while it does not answer.
func (p *sidecarProc) info(t *testing.T) map[string]string {
	t.Helper()
	code, out := run(t, p.sock, "info")
	if code != 0 {
		return nil
	}
	rest, ok := strings.CutPrefix(strings.TrimSpace(out), "INFO ")
	if !ok {
		t.Fatalf("ticketing info printed %q", out)
	}
	f := map[string]string{}
	for _, w := range strings.Split(rest, " ") {
		name, value, _ := strings.Cut(w, "=")
		f[name] = value
	}
	return f
}

// leaderState reads the serving leader's lock state.
func leaderState(t *testing.T, c *local.Cluster, read func(st *locksm.State)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	li, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Node(li).ReadState(read)
}

// The binary's --sessions and --session-timeout reach the cluster: a
// sidecar started with --session-timeout 300s opens its session with that
// timeout (INFO and the leader's state agree on it), and closes it at once
// when it stops (SIGTERM), long before the timeout could have expired it.
// The same settings in a --config file: sessions = off holds no session.
// Values out of bounds are refused at the start (exit 2).
func TestSidecarSessionFlags(t *testing.T) {
	c := sessionCluster(t)

	p := startSidecarProc(t, c, "--sessions", "auto", "--session-timeout", "300s")
	var f map[string]string
	testkit.WaitFor(t, "the sidecar's session attached", 30*time.Second, func() bool {
		f = p.info(t)
		return f != nil && f["session_state"] == "attached"
	})
	if f["sessions"] != "auto" || f["session_timeout_ms"] != "300000" || f["session_opens"] != "1" {
		t.Fatalf("INFO fields %v", f)
	}
	id, err := strconv.ParseUint(f["session"], 16, 64)
	if err != nil || id == 0 {
		t.Fatalf("INFO session=%q: %v", f["session"], err)
	}
	var (
		si    locksm.SessionInfo
		found bool
	)
	leaderState(t, c, func(st *locksm.State) { si, found = st.Session(id) })
	if !found || si.TimeoutMs != 300_000 {
		t.Fatalf("the leader's session %x: %+v (found %v), want timeout 300000 ms", id, si, found)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the sidecar did not stop on SIGTERM")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("sidecar exit %d", code)
	}
	testkit.WaitFor(t, "the stopped sidecar's session closed", 30*time.Second, func() bool {
		leaderState(t, c, func(st *locksm.State) { _, found = st.Session(id) })
		return !found
	})

	conf := filepath.Join(t.TempDir(), "sidecar.conf")
	if err := os.WriteFile(conf, []byte("sessions = off\nsession-timeout = 2s # the lowest\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p = startSidecarProc(t, c, "--config", conf)
	testkit.WaitFor(t, "the sidecar to learn the leader", 30*time.Second, func() bool {
		f = p.info(t)
		return f != nil && f["leader"] != "-"
	})
	if f["sessions"] != "off" || f["session"] != "-" || f["session_state"] != "-" || f["session_timeout_ms"] != "2000" {
		t.Fatalf("sessions = off: INFO fields %v", f)
	}
	var n int
	leaderState(t, c, func(st *locksm.State) { n = st.NumSessions() })
	if n != 0 {
		t.Fatalf("%d sessions in the leader's state with sessions = off", n)
	}

	for _, args := range [][]string{{"--sessions", "on"}, {"--session-timeout", "1999ms"}, {"--session-timeout", "301s"},
		{"--session-timeout", "2500us"}} {
		cmd := exec.Command(binary, append([]string{"sidecar", "--cluster", strings.Join(c.ClientAddrs(), ","),
			"--secret-file", c.SecretFile, "--socket", filepath.Join(t.TempDir(), "x.sock")}, args...)...)
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "invalid value \""+args[1]+"\" for flag -"+args[0][2:]) {
			t.Errorf("%q: %v\n%s", args, err, out)
		}
	}
}
