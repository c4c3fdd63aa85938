package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/local"
)

// notifyRecorder plays systemd's side of sd_notify(3): a unixgram socket
// whose datagrams (one or more KEY=VALUE lines each) it collects.
type notifyRecorder struct {
	t    *testing.T
	path string
	msgs chan string
}

func listenNotify(t *testing.T, path string) *notifyRecorder {
	r := &notifyRecorder{t: t, path: path, msgs: make(chan string, 1024)}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: r.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				close(r.msgs)
				return
			}
			r.msgs <- string(buf[:n])
		}
	}()
	return r
}

// waitFor reads messages until one has the line want, and returns every
// line read meanwhile.
func (r *notifyRecorder) waitFor(want string, timeout time.Duration) []string {
	r.t.Helper()
	var seen []string
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-r.msgs:
			if !ok {
				r.t.Fatalf("notify socket closed while waiting for %s; saw %q", want, seen)
			}
			lines := strings.Split(m, "\n")
			seen = append(seen, lines...)
			for _, l := range lines {
				if l == want {
					return seen
				}
			}
		case <-deadline:
			r.t.Fatalf("no %s within %v; saw %q", want, timeout, seen)
		}
	}
}

// setSystemdEnv sets what systemd sets for a Type=notify service with
// WatchdogSec=: the notify socket and a 200 ms watchdog for this process.
func setSystemdEnv(t *testing.T, notify string) {
	t.Setenv("NOTIFY_SOCKET", notify)
	t.Setenv("WATCHDOG_USEC", "200000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
}

// runCmd runs a command in the background; it returns the cancel that
// plays SIGTERM and a wait for its exit code and output.
func runCmd(run func(ctx context.Context, args []string, stdout, stderr io.Writer) int, args ...string) (cancel func(), wait func() (int, string)) {
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		code int
		out  string
	}
	done := make(chan result, 1)
	go func() {
		// Locked: a node's Raft transport may still log a closed
		// connection after the command returned.
		var out syncBuffer
		code := run(ctx, args, &out, &out)
		done <- result{code, out.String()}
	}()
	return cancel, func() (int, string) {
		select {
		case r := <-done:
			return r.code, r.out
		case <-time.After(60 * time.Second):
			return -1, "did not exit within 60 s"
		}
	}
}

// The node and the sidecar, run as systemd runs them (Type=notify,
// WatchdogSec=, and for the sidecar an activated socket), against a real
// cluster: READY=1 once ready, WATCHDOG=1 every half interval, STOPPING=1
// at SIGTERM. The node also reads its flags from a --config file.
func TestSystemdNotify(t *testing.T) {
	dir, err := os.MkdirTemp("", "sd") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	c, err := local.Start(local.Options{Dir: filepath.Join(dir, "c"), Tune: local.FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("node", func(t *testing.T) {
		// Stop a follower and run it again as `ticketing node --config`.
		i := (leader + 1) % c.Size()
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
		var peers []string
		for j := 0; j < c.Size(); j++ {
			peers = append(peers, c.ID(j)+"="+c.PeerAddr(j))
		}
		conf := filepath.Join(dir, "node.conf")
		writeFile(t, conf, fmt.Sprintf(`# the node, as packaging writes it
id = %s
data-dir = %s
client-addr = %s
peer-addr = %s
peers = %s
cluster-id = %q
secret-file = %s
peer-secret-file = %s
heartbeat-timeout = 600ms
election-timeout = 600ms
leader-lease-timeout = 500ms
log-level = debug
`, c.ID(i), filepath.Join(dir, "c", c.ID(i)), c.ClientAddr(i), c.PeerAddr(i), strings.Join(peers, ","),
			c.ClusterID, c.SecretFile, c.PeerSecretFile))
		t.Setenv("TICKETING_LOG_LEVEL", "warn") // the environment beats the file
		rec := listenNotify(t, filepath.Join(dir, "node.notify"))
		setSystemdEnv(t, rec.path)
		stop, wait := runCmd(runNode, "--config", conf)
		seen := rec.waitFor("READY=1", 30*time.Second)
		t.Logf("node told systemd: %q", seen)
		if !hasPrefix(seen, "STATUS=ready: ") {
			t.Errorf("no ready STATUS= with READY=1: %q", seen)
		}
		for k := 0; k < 3; k++ {
			rec.waitFor("WATCHDOG=1", 5*time.Second)
		}
		stop()
		rec.waitFor("STOPPING=1", 10*time.Second)
		code, out := wait()
		if code != ExitOK {
			t.Fatalf("node exit %d\n%s", code, out)
		}
		if strings.Contains(out, "level=INFO") || strings.Contains(out, "level=DEBUG") {
			t.Errorf("TICKETING_LOG_LEVEL=warn did not beat the file's log-level:\n%s", out)
		}
	})

	t.Run("sidecar", func(t *testing.T) {
		// Socket activation: the listener comes from listeners(), not
		// from --socket, and stays (with its file) after shutdown.
		activated := filepath.Join(dir, "act.sock")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: activated, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		defer func(orig func() ([]net.Listener, error)) { listeners = orig }(listeners)
		listeners = func() ([]net.Listener, error) { return []net.Listener{ln}, nil }
		flagSocket := filepath.Join(dir, "flag.sock")
		rec := listenNotify(t, filepath.Join(dir, "sidecar.notify"))
		setSystemdEnv(t, rec.path)
		stop, wait := runCmd(runSidecar, "--cluster", strings.Join(c.ClientAddrs(), ","), "--secret-file", c.SecretFile,
			"--cluster-id", c.ClusterID, "--socket", flagSocket)
		defer stop()
		// The socket is served before READY (which waits for a leader).
		if got := ping(t, activated); got != "PONG" {
			t.Fatalf("PING on the activated socket: %q", got)
		}
		t.Logf("sidecar told systemd: %q", rec.waitFor("READY=1", 30*time.Second))
		for k := 0; k < 3; k++ {
			rec.waitFor("WATCHDOG=1", 5*time.Second)
		}
		if _, err := os.Lstat(flagSocket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("--socket %s was created under socket activation: %v", flagSocket, err)
		}
		stop()
		rec.waitFor("STOPPING=1", 10*time.Second)
		if code, out := wait(); code != ExitOK {
			t.Fatalf("sidecar exit %d\n%s", code, out)
		}
		if fi, err := os.Lstat(activated); err != nil || fi.Mode().Type() != os.ModeSocket {
			t.Fatalf("the activated socket's file was removed: %v", err)
		}
	})
}

// syncBuffer is a bytes.Buffer that one goroutine may write while another
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func hasPrefix(lines []string, p string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}

func ping(t *testing.T, path string) string {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("PING\n")); err != nil {
		t.Fatal(err)
	}
	l, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(l, "\n")
}

// Socket activation accepts exactly one unix stream socket; no sockets
// means none (serve --socket as without systemd).
func TestActivatedListener(t *testing.T) {
	defer func(orig func() ([]net.Listener, error)) { listeners = orig }(listeners)
	listeners = func() ([]net.Listener, error) { return nil, nil }
	if ln, err := activatedListener(); ln != nil || err != nil {
		t.Fatalf("no LISTEN_FDS: %v %v", ln, err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	listeners = func() ([]net.Listener, error) { return []net.Listener{tcp}, nil }
	if _, err := activatedListener(); err == nil || !strings.Contains(err.Error(), "want a unix stream socket") {
		t.Fatalf("a TCP socket: %v", err)
	}
	listeners = func() ([]net.Listener, error) { return []net.Listener{nil, nil}, nil }
	if _, err := activatedListener(); err == nil || !strings.Contains(err.Error(), "2 file descriptors") {
		t.Fatalf("two non-sockets: %v", err)
	}
}
