package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/localproc"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// benchUnix measures acquire+release cycle latency through the in-process
// Broker and through the unix socket (a unixapi server over the same
// Broker, clients/go clients), for each client count, on one cluster.
func benchUnix(ctx context.Context, p *localproc.Procs, dir string, clientCounts []int, warmup, duration time.Duration, out io.Writer) error {
	bcfg := sidecar.DefaultConfig()
	bcfg.Addrs, bcfg.Secret, bcfg.ClusterID, bcfg.TLS = p.ClientAddrs(), p.ClientSecret, p.ClusterID, p.ClientTLS
	bcfg.Logger = slog.New(slog.DiscardHandler)
	ucfg := unixapi.DefaultConfig()
	ucfg.Path = filepath.Join(dir, "bench.sock")
	b, srv, err := startSidecar(bcfg, ucfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer stopSidecar(b, srv)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = ticketing.WaitReady(wctx, ucfg.Path)
	cancel()
	if err != nil {
		return err
	}
	for _, n := range clientCounts {
		inproc, err := cycles(ctx, n, warmup, duration, func(i int) (func() error, func(), error) {
			key, owner := fmt.Sprintf("bench/inproc/%d/%d", n, i), fmt.Sprintf("bench.%d", i)
			return func() error {
				l, err := b.Acquire(ctx, key, owner, 30*time.Second, 0)
				if err != nil {
					return err
				}
				return b.Release(ctx, l)
			}, func() {}, nil
		})
		if err != nil {
			return fmt.Errorf("in-process, %d clients: %w", n, err)
		}
		viaUnix, err := cycles(ctx, n, warmup, duration, func(i int) (func() error, func(), error) {
			c, err := ticketing.Dial(ctx, ucfg.Path)
			if err != nil {
				return nil, nil, err
			}
			key := fmt.Sprintf("bench/unix/%d/%d", n, i)
			return func() error {
				tok, err := c.Acquire(ctx, key, 30*time.Second, 0)
				if err != nil {
					return err
				}
				return c.Release(ctx, key, tok)
			}, func() { c.Close() }, nil
		})
		if err != nil {
			return fmt.Errorf("unix socket, %d clients: %w", n, err)
		}
		fmt.Fprintf(out, "%3d clients  in-process Broker: %s\n", n, inproc)
		fmt.Fprintf(out, "%3d clients  unix socket:       %s\n", n, viaUnix)
		fmt.Fprintf(out, "%3d clients  added by the socket: p50 %v, p99 %v\n", n,
			(viaUnix.p50 - inproc.p50).Round(time.Microsecond), (viaUnix.p99 - inproc.p99).Round(time.Microsecond))
	}
	return nil
}

// startSidecar starts a Broker and serves it on the unix socket, as
// `ticketing sidecar` does, in this process.
func startSidecar(bcfg sidecar.Config, ucfg unixapi.Config, log *slog.Logger) (*sidecar.Broker, *unixapi.Server, error) {
	bcfg.Logger, ucfg.Logger = log, log
	b, err := sidecar.New(bcfg)
	if err != nil {
		return nil, nil, err
	}
	srv, err := unixapi.Listen(ucfg, b)
	if err != nil {
		b.Close()
		return nil, nil, err
	}
	return b, srv, nil
}

// stopSidecar closes the server, then the broker (see `ticketing sidecar`).
func stopSidecar(b *sidecar.Broker, srv *unixapi.Server) {
	srv.Close()
	b.Close()
}

type latencies struct {
	n             int
	perSec        float64
	p50, p99, max time.Duration
}

func (l latencies) String() string {
	return fmt.Sprintf("%d cycles, %.0f/s, acquire+release p50 %v p99 %v max %v", l.n, l.perSec,
		l.p50.Round(time.Microsecond), l.p99.Round(time.Microsecond), l.max.Round(time.Microsecond))
}

// cycles runs n workers, each calling its cycle in a loop, and returns the
// latencies measured after warmup for duration.
func cycles(ctx context.Context, n int, warmup, duration time.Duration, setup func(i int) (cycle func() error, done func(), err error)) (latencies, error) {
	var measuring, stop atomic.Bool
	lat := make([][]time.Duration, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		cycle, done, err := setup(i)
		if err != nil {
			stop.Store(true)
			wg.Wait()
			return latencies{}, err
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer done()
			for !stop.Load() && ctx.Err() == nil {
				t0 := time.Now()
				if err := cycle(); err != nil {
					errs <- err
					return
				}
				if measuring.Load() {
					lat[i] = append(lat[i], time.Since(t0))
				}
			}
		}(i)
	}
	time.Sleep(warmup)
	measuring.Store(true)
	start := time.Now()
	var err error
	select {
	case <-time.After(duration):
	case err = <-errs:
	case <-ctx.Done():
		err = ctx.Err()
	}
	measuring.Store(false)
	elapsed := time.Since(start)
	stop.Store(true)
	wg.Wait()
	if err != nil {
		return latencies{}, err
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	if len(all) == 0 {
		return latencies{}, fmt.Errorf("no cycle completed")
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	q := func(f float64) time.Duration { return all[int(f*float64(len(all)-1))] }
	return latencies{n: len(all), perSec: float64(len(all)) / elapsed.Seconds(), p50: q(0.5), p99: q(0.99), max: all[len(all)-1]}, nil
}

// benchUnixConns runs `ticketing sidecar` (from bin) as its own process and reports
// its resident memory before and after conns local connections are open
// (each has answered a PING, so its session exists).
func benchUnixConns(ctx context.Context, p *localproc.Procs, dir, bin string, conns int, out io.Writer) error {
	sock := filepath.Join(dir, "conns.sock")
	args := []string{"sidecar", "--cluster", strings.Join(p.ClientAddrs(), ","),
		"--secret-file", filepath.Join(dir, "cluster", "client.secret"), "--cluster-id", p.ClusterID,
		"--socket", sock, "--max-conns", strconv.Itoa(conns + 16), "--log-level", "warn"}
	if p.CAFile != "" {
		args = append(args, "--tls-ca", p.CAFile)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt) // fails only if it has exited; Wait reaps it either way
		cmd.Wait()
	}()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := ticketing.WaitReady(wctx, sock)
	cancel()
	if err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	before, err := vmRSS(cmd.Process.Pid)
	if err != nil {
		return err
	}
	open := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	start := time.Now()
	for i := 0; i < conns; i++ {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return fmt.Errorf("connection %d: %w (raise ulimit -n?)", i, err)
		}
		open = append(open, c)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("PING\n")); err != nil {
			return err
		}
		if l, err := bufio.NewReader(c).ReadString('\n'); err != nil || l != "PONG\n" {
			return fmt.Errorf("connection %d: PING answered %q, %v", i, l, err)
		}
		c.SetDeadline(time.Time{})
	}
	opened := time.Since(start)
	time.Sleep(time.Second) // let the sidecar's heap settle
	after, err := vmRSS(cmd.Process.Pid)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "sidecar process VmRSS: %d KiB idle, %d KiB with %d open connections (%.1f KiB per connection); opened in %v\n",
		before, after, conns, float64(after-before)/float64(conns), opened.Round(time.Millisecond))
	return nil
}

// vmRSS reads a process's resident set size in KiB from /proc.
func vmRSS(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// cpuTime is a process's CPU time, user and system, from /proc/PID/stat
// (in clock ticks of 10 ms: USER_HZ is 100 on Linux).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// the fields after it start past the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	// utime and stime are fields 14 and 15, so 12 and 13 after the name.
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return time.Duration(u+st) * 10 * time.Millisecond, nil
}
