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
	bin := ticketingBin(t)
	sdir, err := os.MkdirTemp("", "tkd") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sdir) })
	sock := filepath.Join(sdir, "s")
	cmd := exec.Command(bin, "dev", "--base-port", "0", "--dir", filepath.Join(t.TempDir(), "data"), "--socket", sock)
	var stderr lockedBuf
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s dev: %v", bin, err)
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
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	select {
	case <-ready:
	case <-done:
		t.Fatalf("ticketing dev exited before ready:\n%s", stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("ticketing dev not ready within 60s:\n%s", stderr.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ticketing.WaitReady(ctx, sock); err != nil {
		t.Fatal(err)
	}
	return sock
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
