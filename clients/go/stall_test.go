package ticketing_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
)

// stall stops this whole process with SIGSTOP for about d, as a stalled
// holder is stopped: a child shell sends SIGCONT after d. Every goroutine
// (the client's reader, its lock timers, the test's own timers) stops
// with it; the sidecar and the cluster, other processes, do not.
func stall(t *testing.T, d time.Duration) {
	t.Helper()
	cont := exec.Command("sh", "-c", fmt.Sprintf("sleep %.3f; kill -CONT %d", d.Seconds(), os.Getpid()))
	if err := cont.Start(); err != nil {
		t.Fatalf("stall: start the SIGCONT sender: %v", err)
	}
	start := time.Now()
	if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("stall: SIGSTOP: %v", err)
	}
	if err := cont.Wait(); err != nil {
		t.Fatalf("stall: the SIGCONT sender: %v", err)
	}
	// The monotonic clock ran on while stopped, so this is how long we
	// were stopped (the sender's sleep started after the Start above).
	if el := time.Since(start); el < d {
		t.Fatalf("stall: resumed after %v, before %v", el, d)
	}
}

// ticketingBin returns $TICKETING_BIN, or builds ticketing/cmd/ticketing
// into a test directory.
func ticketingBin(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("TICKETING_BIN"); b != "" {
		return b
	}
	bin := filepath.Join(t.TempDir(), "ticketing")
	out, err := exec.Command("go", "build", "-o", bin, "ticketing/cmd/ticketing").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ticketing/cmd/ticketing: %v\n%s", err, out)
	}
	return bin
}

// devSocket starts `ticketing dev` (3 nodes and a sidecar in another
// process) on free ports for the test and returns its sidecar's socket
// once the sidecar knows a leader. It is stopped (SIGINT) at cleanup.
func devSocket(t *testing.T) string {
	t.Helper()
	return startDev(t).sock
}

// devProc is a running `ticketing dev` whose process the test may restart.
type devProc struct {
	t    *testing.T
	bin  string
	sock string
	data string // --dir: the cluster's state, kept across restarts
	cmd  *exec.Cmd
	done chan struct{} // closed when the process exited
	err  *lockedBuf
}

// startDev starts `ticketing dev` as devSocket does, and returns it.
func startDev(t *testing.T) *devProc {
	t.Helper()
	sdir, err := os.MkdirTemp("", "tkd") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sdir) })
	d := &devProc{t: t, bin: ticketingBin(t), sock: filepath.Join(sdir, "s"), data: filepath.Join(t.TempDir(), "data")}
	d.start()
	t.Cleanup(d.stop)
	return d
}

// start runs the process and waits until its sidecar knows a leader.
func (d *devProc) start() {
	t := d.t
	t.Helper()
	cmd := exec.Command(d.bin, "dev", "--base-port", "0", "--dir", d.data, "--socket", d.sock)
	stderr := &lockedBuf{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s dev: %v", d.bin, err)
	}
	ready, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for said := false; sc.Scan(); {
			if strings.Contains(sc.Text(), "ready") && !said {
				said = true
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, out)
		cmd.Wait()
	}()
	d.cmd, d.done, d.err = cmd, done, stderr
	select {
	case <-ready:
	case <-done:
		t.Fatalf("ticketing dev exited before ready:\n%s", stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("ticketing dev not ready within 60s:\n%s", stderr.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ticketing.WaitReady(ctx, d.sock); err != nil {
		t.Fatal(err)
	}
}

// stop stops the process as Ctrl-C does (SIGINT: the sidecar shuts down
// in order), SIGKILL if it has not exited after 20 s (a hang guard).
func (d *devProc) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

// restart stops the sidecar's process and starts it again on the same
// socket, with the same cluster state (--dir), as an operator restarting
// it does; it returns once the new sidecar knows a leader.
func (d *devProc) restart() {
	d.t.Helper()
	d.stop()
	d.start()
}

// lockedBuf is a strings.Builder that a process's output goroutine may
// write while the test reads it.
type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
