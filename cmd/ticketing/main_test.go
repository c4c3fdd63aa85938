package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/localproc"
	"ticketing/cluster/testkit"
	"ticketing/cluster/tlsconf"
	"ticketing/cluster/wire"
)

var binary string

// TestMain builds the real binary once; the tests run it as processes.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ticketing-bin-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "ticketing")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestNodeRefusesEvenVoterCounts(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "s")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, peers := range []string{
		"n1=127.0.0.1:1,n2=127.0.0.1:2",
		"n1=127.0.0.1:1,n2=127.0.0.1:2,n3=127.0.0.1:3,n4=127.0.0.1:4",
	} {
		cmd := exec.Command(binary, "node", "--id", "n1", "--data-dir", filepath.Join(dir, "d"),
			"--client-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:1", "--peers", peers,
			"--secret-file", secret, "--peer-secret-file", secret)
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 {
			t.Fatalf("peers %s: want exit 2, got %v\n%s", peers, err, out)
		}
		if !strings.Contains(string(out), "exactly 3 or 5 voters") {
			t.Fatalf("peers %s: message does not say why:\n%s", peers, out)
		}
	}
}

func TestNodeRefusesWorldReadableSecret(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "s")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "node", "--id", "n1", "--data-dir", filepath.Join(dir, "d"),
		"--client-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:1",
		"--peers", "n1=127.0.0.1:1,n2=127.0.0.1:2,n3=127.0.0.1:3",
		"--secret-file", secret, "--peer-secret-file", secret)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "chmod 600") {
		t.Fatalf("want a refusal naming chmod 600, got %v\n%s", err, out)
	}
}

// The dev command runs a real cluster, says it is ready, grants, and stops
// cleanly on SIGINT.
func TestDevReadyAndGrants(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(binary, "dev", "--base-port", "0", "--dir", dir, "--socket", filepath.Join(dir, "ticketing.sock"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	var addrs []string
	var secretFile, caFile string
	ready := false
	deadline := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer deadline.Stop()
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) == 4 && f[0] == "node" && f[2] == "client" {
			addrs = append(addrs, f[3])
		}
		if s, ok := strings.CutPrefix(strings.TrimSpace(line), "client secret file: "); ok {
			secretFile = s
		}
		if s, ok := strings.CutPrefix(strings.TrimSpace(line), "tls ca file: "); ok {
			caFile = s
		}
		if strings.Contains(line, "ready") {
			ready = true
			break
		}
	}
	if !ready || len(addrs) != 3 || secretFile == "" || caFile == "" {
		t.Fatalf("dev output incomplete: ready=%v addrs=%v secret=%q ca=%q", ready, addrs, secretFile, caFile)
	}
	// dev runs TLS with a throwaway CA: a plaintext client is refused with
	// a clear error, a client that trusts the CA gets in.
	tlsCfg, err := tlsconf.ClientConfig(tlsconf.Files{CAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	secret, err := os.ReadFile(secretFile)
	if err != nil {
		t.Fatal(err)
	}
	granted := false
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err = client.Dial(ctx, addrs[0], client.Config{Secret: []byte(strings.TrimSpace(string(secret))), ClusterID: "dev"})
	cancel()
	if !errors.Is(err, wire.ErrTLSRequired) {
		t.Fatalf("plaintext dial of dev's TLS port: %v, want tls_required", err)
	}
	for _, a := range addrs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := client.Dial(ctx, a, client.Config{Secret: []byte(strings.TrimSpace(string(secret))), ClusterID: "dev", TLS: tlsCfg})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquire, Key: "k", Owner: "o", Lease: 5})
		cancel()
		conn.Close()
		if err == nil && r.Type == wire.TypeGranted {
			granted = true
			break
		}
	}
	if !granted {
		t.Fatal("no node of the dev cluster granted")
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dev exited with %v after SIGINT", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("dev did not stop after SIGINT")
	}
}

// SIGKILL of the leader process: a new leader grants, with tokens above
// every earlier one, and the killed node rejoins from its data dir.
func TestLeaderSIGKILL(t *testing.T) {
	p, err := localproc.Start(localproc.Options{Binary: binary, Dir: t.TempDir(),
		ExtraArgs: []string{"--log-level", "warn"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Hang guards, not speed bounds: two concurrent -race suites on 2
	// cores (CI) slow elections and catch-up well past a quiet machine's.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var max uint64
	for round := 0; round < 2; round++ {
		li, err := p.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := p.Dial(ctx, li)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquire, Key: fmt.Sprintf("r%d/%d", round, i), Owner: "o", Lease: 60})
			if err != nil || r.Type != wire.TypeGranted || r.Token <= max {
				t.Fatalf("acquire: %v %c token %d (max %d)", err, r.Type, r.Token, max)
			}
			max = r.Token
		}
		conn.Close()
		if err := p.Signal(li, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		ni, err := p.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ni == li {
			t.Fatal("killed node still leader")
		}
		if err := p.Start(li); err != nil {
			t.Fatal(err)
		}
	}
	// The new leader knows every earlier holder and grants above max.
	var r wire.Msg
	for until := time.Now().Add(90 * time.Second); time.Now().Before(until); {
		li, err := p.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := p.Dial(ctx, li)
		if err != nil {
			continue
		}
		r, _, err = conn.Do(ctx, wire.Msg{Type: wire.TypeAcquire, Key: "r0/0", Owner: "x", Lease: 5})
		if err == nil && r.Type == wire.TypeBusy {
			r, _, err = conn.Do(ctx, wire.Msg{Type: wire.TypeAcquire, Key: "new", Owner: "x", Lease: 5})
		}
		conn.Close()
		if err == nil && r.Type != wire.TypeMoved {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.Type != wire.TypeGranted || r.Token <= max {
		t.Fatalf("after two leader kills: %c token %d, want G above %d", r.Type, r.Token, max)
	}
	// The restarted node has caught up with the whole history.
	waitDeadline := time.Now().Add(90 * time.Second)
	for {
		behind := 0
		for i := 0; i < p.Size(); i++ {
			st, err := p.Status(ctx, i)
			if err != nil || st.LastToken < r.Token {
				behind++
			}
		}
		if behind == 0 {
			break
		}
		if time.Now().After(waitDeadline) {
			for i := 0; i < p.Size(); i++ {
				st, err := p.Status(ctx, i)
				t.Logf("%s: status %+v, err %v, exited by itself %v", p.ID(i), st, err, p.Exited(i))
				if b, err := os.ReadFile(p.LogFile(i)); err == nil {
					t.Logf("%s's log:\n%s", p.ID(i), b)
				}
			}
			t.Fatalf("%d nodes never caught up to token %d", behind, r.Token)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startDevSidecar runs `ticketing dev` with its sidecar on a fresh socket
// and returns the socket path once dev says it is ready.
func startDevSidecar(t *testing.T) string {
	t.Helper()
	return startDev(t).sock
}

// devCluster is what a `ticketing dev` printed: its sidecar's socket and
// how to reach its nodes.
type devCluster struct {
	sock, secretFile, caFile string
	addrs                    []string
}

// leaderStatus asks dc's nodes for their status and returns the serving
// leader's ('s' request; ok false while none serves).
func (dc devCluster) leaderStatus(t *testing.T) (wire.Msg, bool) {
	t.Helper()
	secret, err := os.ReadFile(dc.secretFile)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := tlsconf.ClientConfig(tlsconf.Files{CAFile: dc.caFile})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range dc.addrs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := client.Dial(ctx, a, client.Config{Secret: []byte(strings.TrimSpace(string(secret))), ClusterID: "dev", TLS: tlsCfg})
		if err == nil {
			st, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeStatus})
			conn.Close()
			if err == nil && st.Role == wire.RoleLeader && st.LeaderID == st.NodeID {
				cancel()
				return st, true
			}
		}
		cancel()
	}
	return wire.Msg{}, false
}

func startDev(t *testing.T) devCluster {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "tks")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "s")
	cmd := exec.Command(binary, "dev", "--base-port", "0", "--dir", t.TempDir(), "--socket", sock)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	})
	deadline := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer deadline.Stop()
	sc := bufio.NewScanner(stdout)
	dc := devCluster{}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if s, ok := strings.CutPrefix(line, "sidecar socket: "); ok {
			dc.sock = s
		}
		if s, ok := strings.CutPrefix(line, "client secret file: "); ok {
			dc.secretFile = s
		}
		if s, ok := strings.CutPrefix(line, "tls ca file: "); ok {
			dc.caFile = s
		}
		if f := strings.Fields(line); len(f) == 4 && f[0] == "node" && f[2] == "client" {
			dc.addrs = append(dc.addrs, f[3])
		}
		if strings.Contains(sc.Text(), "ready") {
			if dc.sock != sock {
				t.Fatalf("dev printed sidecar socket %q, want %q", dc.sock, sock)
			}
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return dc
		}
	}
	t.Fatal("dev never printed its ready line")
	return devCluster{}
}

// run runs the binary and returns its exit code and combined output.
func run(t *testing.T, sock string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "TICKETING_SOCKET="+sock)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// holdLock starts `ticketing acquire --hold KEY` and returns it once it
// printed its token.
func holdLock(t *testing.T, sock, key string, extra ...string) (*exec.Cmd, uint64) {
	t.Helper()
	cmd := exec.Command(binary, append(append([]string{"acquire", "--hold", "--socket", sock}, extra...), key)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	tok, perr := strconv.ParseUint(strings.TrimSpace(line), 10, 64)
	if err != nil || perr != nil {
		t.Fatalf("acquire --hold printed %q: %v %v", line, err, perr)
	}
	return cmd, tok
}

// The client commands' exit codes and the lock command's environment.
func TestLockCommandExitCodes(t *testing.T) {
	sock := startDevSidecar(t)
	if code, out := run(t, sock, "ping"); code != 0 || !strings.HasPrefix(out, "PONG") {
		t.Fatalf("ping: %d %q", code, out)
	}
	if code, out := run(t, sock, "info"); code != 0 || !strings.Contains(out, "cluster=dev leader=127.0.0.1:") {
		t.Fatalf("info: %d %q", code, out)
	}
	code, out := run(t, sock, "lock", "--lease", "10", "k1", "--", "sh", "-c", `echo "key=$TICKETING_KEY token=$TICKETING_TOKEN"; exit 7`)
	if code != 7 || !strings.Contains(out, "key=k1 token=") || strings.Contains(out, "token=\n") {
		t.Fatalf("lock: exit %d, output %q; want 7 and the env vars", code, out)
	}
	hold, tok := holdLock(t, sock, "k2")
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"lock", "--wait", "0", "k2", "--", "true"}, 75},
		{[]string{"lock", "--wait", "0.3", "k2", "--", "true"}, 76},
		{[]string{"acquire", "--wait", "0", "k2"}, 75},
		{[]string{"release", "k2", strconv.FormatUint(tok, 10)}, 78},                // another connection's lock
		{[]string{"lock", "--lease", "0", "k3", "--", "true"}, 64},                  // EX_USAGE
		{[]string{"lock", "k3"}, 64},                                                // EX_USAGE
		{[]string{"lock", "k3 with spaces", "--", "true"}, 64},                      // a key the protocol refuses: EX_USAGE
		{[]string{"lock", "k3", "--", "/nonexistent/command"}, 78},                  // the command could not start
		{[]string{"lock", "--socket", "/nonexistent/sock", "k3", "--", "true"}, 69}, // EX_UNAVAILABLE: no sidecar
		{[]string{"ping", "--socket", "/nonexistent/sock"}, 69},
		{[]string{"lock", "k3", "--", "sh", "-c", "kill -TERM $$"}, 128 + int(syscall.SIGTERM)},
		{[]string{"acquire", "k3"}, 0}, // a probe: taken and released
		{[]string{"lock", "--wait", "0", "k3", "--", "true"}, 0},
	} {
		if code, out := run(t, sock, tc.args...); code != tc.code {
			t.Errorf("%v: exit %d, want %d\n%s", tc.args, code, tc.code, out)
		}
	}
	// SIGINT ends --hold, which releases: k2 is free at once.
	_ = hold.Process.Signal(syscall.SIGINT)
	if err := hold.Wait(); err != nil {
		t.Fatalf("acquire --hold after SIGINT: %v", err)
	}
	if code, out := run(t, sock, "lock", "--wait", "0", "k2", "--", "true"); code != 0 {
		t.Fatalf("k2 after the holder's SIGINT: %d %s", code, out)
	}
}

// `ticketing lock K1 K2 ... -- COMMAND` holds the keys as one seat block
// while COMMAND runs (TICKETING_KEY, TICKETING_KEYS, TICKETING_TOKEN), with
// lock's exit codes; `acquire` takes a block too; one key without the --
// works as it always did.
func TestLockCommandBlock(t *testing.T) {
	sock := startDevSidecar(t)
	script := `echo "key=$TICKETING_KEY keys=$TICKETING_KEYS token=$TICKETING_TOKEN"; ` +
		`"$TK" acquire --wait 0 b/2; echo "inner=$?"; exit 7`
	cmd := exec.Command(binary, "lock", "--lease", "10", "b/1", "b/2", "b/3", "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "TICKETING_SOCKET="+sock, "TK="+binary)
	outb, err := cmd.CombinedOutput()
	out := string(outb)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 ||
		!strings.Contains(out, "key=b/1 keys=b/1 b/2 b/3 token=") || strings.Contains(out, "token=\n") ||
		!strings.Contains(out, "inner=75") {
		t.Fatalf("lock of a block: %v, output %q; want exit 7, the env vars, and b/2 busy inside", err, out)
	}
	hold, _ := holdLock(t, sock, "b/2")
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"lock", "--wait", "0", "b/1", "b/2", "b/3", "--", "true"}, 75},
		{[]string{"lock", "--wait", "0.3", "b/3", "b/2", "--", "true"}, 76},
		{[]string{"acquire", "--wait", "0", "b/2", "b/4"}, 75},
		{[]string{"lock", "--wait", "0", "b/1", "b/3", "--", "true"}, 0}, // the timed-out block left nothing held
		{[]string{"acquire", "--wait", "0", "b/1", "b/3"}, 0},
		{[]string{"lock", "b/1", "b/1", "--", "true"}, 64},
		{[]string{"lock", "b/1", "b/3", "--"}, 64},
		{[]string{"lock", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "--", "true"}, 64},
		{[]string{"lock", "b/1", "b/3", "--", "sh", "-c", "kill -TERM $$"}, 128 + int(syscall.SIGTERM)},
		{[]string{"lock", "--wait", "0", "b/5", "sh", "-c", `test "$TICKETING_KEYS" = b/5`}, 0}, // one key, no --
	} {
		if code, out := run(t, sock, tc.args...); code != tc.code {
			t.Errorf("%v: exit %d, want %d\n%s", tc.args, code, tc.code, out)
		}
	}
	_ = hold.Process.Signal(syscall.SIGINT)
	if err := hold.Wait(); err != nil {
		t.Fatalf("acquire --hold after SIGINT: %v", err)
	}
	if code, out := run(t, sock, "lock", "--wait", "0", "b/1", "b/2", "b/3", "--", "true"); code != 0 {
		t.Fatalf("the block after the holder's SIGINT: %d %s", code, out)
	}
}

// A client process SIGKILLed while holding: the sidecar notices the closed
// connection and releases at once, so the next waiter gets the key long
// before the 60 s lease could have expired (typically within a few hundred
// milliseconds; the bound is loose because tests must not depend on the
// machine's speed, only on which mechanism freed the key).
func TestKilledHolderFreesKeyFast(t *testing.T) {
	dc := startDev(t)
	sock := dc.sock
	for _, how := range []string{"acquire --hold", "lock -- sleep 60"} {
		key := "killed/" + strings.Fields(how)[0]
		var holder *exec.Cmd
		if how == "acquire --hold" {
			holder, _ = holdLock(t, sock, key)
		} else {
			holder = exec.Command(binary, "lock", "--socket", sock, key, "--", "sleep", "60")
			// Its own process group, so the orphaned sleep can be cleaned up.
			holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := holder.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = syscall.Kill(-holder.Process.Pid, syscall.SIGKILL); _ = holder.Wait() })
			// Wait until it holds: a probe gets BUSY.
			for until := time.Now().Add(10 * time.Second); ; {
				if code, _ := run(t, sock, "acquire", "--wait", "0", key); code == 75 {
					break
				}
				if time.Now().After(until) {
					t.Fatal("lock -- sleep 60 never held the key")
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		type res struct {
			code int
			out  string
			at   time.Time
		}
		got := make(chan res, 1)
		go func() {
			code, out := run(t, sock, "acquire", "--wait", "10", key)
			got <- res{code, out, time.Now()}
		}()
		testkit.WaitFor(t, "the waiter to be queued on the leader", 10*time.Second, func() bool {
			st, ok := dc.leaderStatus(t)
			return ok && st.Waiting >= 1
		})
		killed := time.Now()
		_ = holder.Process.Signal(syscall.SIGKILL)
		r := <-got
		if r.code != 0 {
			t.Fatalf("%s: waiter exit %d: %s", how, r.code, r.out)
		}
		d := r.at.Sub(killed)
		t.Logf("%s: SIGKILL to next holder's exit: %v", how, d)
		// The waiter's time includes its own release and exit. The lease
		// is 60 s: anything well under it means the disconnect freed the
		// key, not the lease.
		if d > 20*time.Second {
			t.Fatalf("%s: next waiter got the key %v after the holder's SIGKILL: freed by the lease, not the disconnect", how, d)
		}
	}
}

// Defect 3 of issue 32: a replacement node started with the old voters'
// --peers listened on --peer-addr 17504 and told its peers 17502, its
// entry in --peers. It now refuses to start, saying which flag to fix.
func TestNodeRefusesPeersEntryOtherThanPeerAddr(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "c")
	peerSecret := filepath.Join(dir, "p")
	for i, f := range []string{secret, peerSecret} {
		if err := os.WriteFile(f, []byte(fmt.Sprintf("%d123456789abcdef0123456789abcdef\n", i)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Two free ports: the one the node is told to listen on (free again,
	// so that without the check the node would start there), and the one
	// its --peers entry names.
	var ports []string
	for i := range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, ln.Addr().String())
		if i == 0 {
			ln.Close()
		} else {
			defer ln.Close()
		}
	}
	listen, entry := ports[0], ports[1]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang guard: a node that starts runs on
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "node", "--id", "n2", "--data-dir", filepath.Join(dir, "d"),
		"--client-addr", "127.0.0.1:0", "--peer-addr", listen,
		"--peers", "n1=127.0.0.1:1,n2="+entry+",n3=127.0.0.1:3",
		"--secret-file", secret, "--peer-secret-file", peerSecret)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the node started, listening on %s while its --peers entry says %s:\n%s", listen, entry, out)
	}
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 {
		t.Fatalf("want exit 2, got %v\n%s", err, out)
	}
	for _, want := range []string{"--peer-addr is " + listen, "n2=" + entry, "Fix --peers", "leave it out"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "d")); err == nil {
		t.Errorf("the refused node created its data dir")
	}
}

// A web console beyond loopback needs TLS and the admin secret: a node
// asked for one without refuses to start, and says what it needs.
func TestNodeRefusesAnExposedConsole(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "s")
	peer := filepath.Join(dir, "p")
	for _, f := range []string{secret, peer} {
		if err := os.WriteFile(f, []byte(f+"-0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(binary, "node", "--id", "n1", "--data-dir", filepath.Join(dir, "d"),
		"--client-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:1",
		"--peers", "n1=127.0.0.1:1,n2=127.0.0.1:2,n3=127.0.0.1:3",
		"--secret-file", secret, "--peer-secret-file", peer, "--console-addr", "0.0.0.0:0")
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--console-addr beyond loopback needs TLS") {
		t.Fatalf("a console on 0.0.0.0 without TLS and admin secret: %v\n%s", err, out)
	}
}
