package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// devCluster is a running `ticketing dev` (3 nodes and a sidecar).
type devCluster struct {
	cmd    *exec.Cmd
	socket string
	done   chan struct{}
}

// startDev starts `ticketing dev` on free ports with its data and socket in
// dir, and waits for its "ready" line. bin "" builds ticketing/cmd/ticketing
// with go build (the working directory must be inside the module).
func startDev(ctx context.Context, bin, dir string, logf func(string, ...any)) (*devCluster, error) {
	if bin == "" {
		bin = filepath.Join(dir, "ticketing")
		logf("building ticketing (set TICKETING_BIN or --ticketing-bin to skip)")
		b := exec.CommandContext(ctx, "go", "build", "-o", bin, "ticketing/cmd/ticketing")
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			return nil, fmt.Errorf("go build ticketing/cmd/ticketing: %w", err)
		}
	}
	d := &devCluster{socket: filepath.Join(dir, "s.sock"), done: make(chan struct{})}
	d.cmd = exec.Command(bin, "dev", "--base-port", "0", "--dir", filepath.Join(dir, "data"), "--socket", d.socket)
	var stderr strings.Builder
	d.cmd.Stderr = &limited{w: &stderr, n: 8192}
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s dev: %w", bin, err)
	}
	ready := make(chan struct{})
	go func() {
		defer close(d.done)
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			if s, ok := strings.CutPrefix(strings.TrimSpace(line), "sidecar socket:"); ok {
				d.socket = strings.TrimSpace(s)
			}
			if strings.Contains(line, "ready") && !signalled {
				signalled = true
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, out) // drains the pipe until the process exits; its end is the only news
		d.cmd.Wait()
	}()
	select {
	case <-ready:
		logf("ticketing dev is ready; sidecar socket %s", d.socket)
		return d, nil
	case <-d.done:
		return nil, fmt.Errorf("ticketing dev exited before ready:\n%s", stderr.String())
	case <-time.After(60 * time.Second):
		d.stop()
		return nil, errors.New("ticketing dev: not ready within 60s:\n" + stderr.String())
	case <-ctx.Done():
		d.stop()
		return nil, ctx.Err()
	}
}

// stop sends SIGINT (as Ctrl-C) and waits; SIGKILL after 20 s.
func (d *devCluster) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGINT) // fails only if it has exited; done is then closed
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

// limited keeps the first n bytes written.
type limited struct {
	w io.Writer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		_, _ = l.w.Write(p[:k]) // a log excerpt: the rest of the output is discarded anyway
		l.n -= k
	}
	return len(p), nil
}
