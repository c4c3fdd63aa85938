package compare

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The line floor ("line-floor" in --systems) is what the sidecar's local
// protocol costs by itself: a server of the lab's, in its own process,
// speaking the same ACQUIRE/RELEASE lines on a unix socket with the least
// a Go server can do per request: a goroutine per connection reading as
// the sidecar does (every line of a read handled before the next read,
// and the read that finds the socket empty, which a server needs to see a
// peer's close that came with its last bytes), one write per reply
// straight from the goroutine that decides it, and an in-memory FIFO lock
// table under one mutex. No
// replication, no disk, no TLS, no leader to send to. Against the
// sidecar's own CPU per cycle, the difference is what the sidecar adds to
// the socket I/O every sidecar pays: the broker, its connection to the
// leader and its bookkeeping.

// lineFloorEnv names the socket a re-executed lab process serves the line
// floor on (ServeLineFloorIfAsked).
const lineFloorEnv = "TICKETLAB_LINE_FLOOR_SOCKET"

// ServeLineFloorIfAsked serves the line floor and exits when this process
// was started for it (the lab re-executes itself: the floor's CPU is its
// own process's); otherwise it returns at once. ticketlab's main and the
// tests of packages that run compare call it first.
func ServeLineFloorIfAsked() {
	sock := os.Getenv(lineFloorEnv)
	if sock == "" {
		return
	}
	if err := serveLineFloor(sock); err != nil {
		fmt.Fprintln(os.Stderr, "line floor:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// serveLineFloor serves until stdin closes (the lab's end of the pipe: the
// server never outlives the lab).
func serveLineFloor(sock string) error {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		ln.Close()
	}()
	t := &floorTable{keys: map[string]*floorKey{}}
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil // stdin closed: done
		}
		go t.serve(c.(*net.UnixConn))
	}
}

// floorTable is the line floor's lock table: per key a holder's token and
// a FIFO queue of waiting connections.
type floorTable struct {
	mu    sync.Mutex
	token uint64
	keys  map[string]*floorKey
}

type floorKey struct {
	holder  uint64
	by      *floorConn
	waiters []*floorConn
}

type floorConn struct {
	c    *net.UnixConn
	wmu  sync.Mutex
	dead bool // guarded by floorTable.mu
	held map[string]uint64
}

// reply writes one line; a failed write ends nothing here (the reader sees
// the connection end).
func (fc *floorConn) reply(line string) {
	fc.wmu.Lock()
	_, _ = fc.c.Write([]byte(line + "\n"))
	fc.wmu.Unlock()
}

func (t *floorTable) serve(c *net.UnixConn) {
	fc := &floorConn{c: c, held: map[string]uint64{}}
	defer t.drop(fc)
	buf := make([]byte, 512)
	var line []byte
	for {
		n, err := c.Read(buf)
		p := buf[:n]
		for len(p) > 0 {
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				line = append(line, p...)
				break
			}
			line = append(line, p[:i]...)
			t.handle(fc, string(line))
			line, p = line[:0], p[i+1:]
		}
		if err != nil || len(line) > 4096 {
			return
		}
	}
}

// handle answers ACQUIRE key lease wait (granted now or when the key
// comes to it; the wait is not bounded) and RELEASE key token.
func (t *floorTable) handle(fc *floorConn, line string) {
	f := bytes.Fields([]byte(line))
	switch {
	case len(f) == 4 && string(f[0]) == "ACQUIRE":
		key := string(f[1])
		t.mu.Lock()
		k := t.keys[key]
		if k == nil {
			k = &floorKey{}
			t.keys[key] = k
		}
		if k.by == nil {
			t.token++
			k.holder, k.by = t.token, fc
			fc.held[key] = t.token
			tok := t.token
			t.mu.Unlock()
			fc.reply("OK " + strconv.FormatUint(tok, 10))
			return
		}
		k.waiters = append(k.waiters, fc)
		t.mu.Unlock()
	case len(f) == 3 && string(f[0]) == "RELEASE":
		tok, err := strconv.ParseUint(string(f[2]), 10, 64)
		key := string(f[1])
		t.mu.Lock()
		k := t.keys[key]
		if err != nil || k == nil || k.by != fc || k.holder != tok {
			t.mu.Unlock()
			fc.reply("ERR not_held")
			return
		}
		next, ntok := t.handOnLocked(key, k)
		t.mu.Unlock()
		fc.reply("OK")
		if next != nil {
			next.reply("OK " + strconv.FormatUint(ntok, 10))
		}
	default:
		fc.reply("ERR bad_request")
	}
}

// handOnLocked frees key from its holder and grants it to the first live
// waiter, whom the caller tells. Requires mu.
func (t *floorTable) handOnLocked(key string, k *floorKey) (*floorConn, uint64) {
	delete(k.by.held, key)
	k.by = nil
	for len(k.waiters) > 0 {
		w := k.waiters[0]
		k.waiters = k.waiters[1:]
		if w.dead {
			continue
		}
		t.token++
		k.holder, k.by = t.token, w
		w.held[key] = t.token
		return w, t.token
	}
	delete(t.keys, key)
	return nil, 0
}

// drop ends a connection: its keys go to their next waiters.
func (t *floorTable) drop(fc *floorConn) {
	fc.c.Close()
	t.mu.Lock()
	fc.dead = true
	type grant struct {
		to  *floorConn
		tok uint64
	}
	var grants []grant
	for key := range fc.held {
		if k := t.keys[key]; k != nil && k.by == fc {
			if next, tok := t.handOnLocked(key, k); next != nil {
				grants = append(grants, grant{next, tok})
			}
		}
	}
	t.mu.Unlock()
	for _, g := range grants {
		g.to.reply("OK " + strconv.FormatUint(g.tok, 10))
	}
}

// lineFloor is the line floor as a System: the re-executed lab process.
type lineFloor struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	dir   string
	sock  string
}

func startLineFloor(ctx context.Context) (*lineFloor, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tb-floor-") // a unix socket path must stay short
	if err != nil {
		return nil, err
	}
	lf := &lineFloor{dir: dir, sock: filepath.Join(dir, "floor.sock")}
	lf.cmd = exec.Command(self)
	lf.cmd.Env = append(os.Environ(), lineFloorEnv+"="+lf.sock)
	var stderr bytes.Buffer
	lf.cmd.Stderr = &stderr
	if lf.stdin, err = lf.cmd.StdinPipe(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := lf.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("unix", lf.sock)
		if err == nil {
			c.Close()
			return lf, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			lf.Close()
			return nil, fmt.Errorf("the line floor's server did not listen: %w (%s)", err, bytes.TrimSpace(stderr.Bytes()))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (lf *lineFloor) Name() string { return "line-floor" }
func (lf *lineFloor) Setup() string {
	return "the lab's own server (one process) speaking the sidecar's ACQUIRE/RELEASE lines on a unix socket with the least Go can do per request " +
		"(a goroutine per connection reading as the sidecar does, one write per reply, an in-memory FIFO lock table; no replication, disk or TLS): " +
		"the floor under the sidecar's local protocol"
}
func (lf *lineFloor) Version() string                         { return "lab" }
func (lf *lineFloor) Prepare(context.Context, []string) error { return nil }

func (lf *lineFloor) Processes(context.Context) ([]Process, error) {
	return []Process{{Name: "line-floor", Role: "sidecar", Pid: lf.cmd.Process.Pid}}, nil
}

func (lf *lineFloor) Clients(ctx context.Context, n int) ([]Client, func(), error) {
	var out []Client
	for i := 0; i < n; i++ {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", lf.sock)
		if err != nil {
			closeAll(out)
			return nil, nil, err
		}
		out = append(out, &lineClient{conn: c, r: bufio.NewReader(c)})
	}
	return out, func() {}, nil
}

func (lf *lineFloor) Close() {
	// Its stdin closing ends it; its exit status says nothing the run
	// needs (killed, it would say so).
	_ = lf.stdin.Close()
	exited := make(chan struct{})
	go func() {
		_ = lf.cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = lf.cmd.Process.Kill() // it should have ended with its stdin
		<-exited
	}
	os.RemoveAll(lf.dir)
}

// lineFloorSection writes results.md's comparison of the sidecar process
// with the line floor, run by run: what the sidecar costs beyond the local
// protocol's own I/O.
func (r *Report) lineFloorSection(b *bytes.Buffer) {
	var rows []string
	for _, w := range r.Config.Workloads {
		for _, n := range r.Config.Clients {
			sc, ok1 := r.find("ticketing-sidecar", w, n)
			lf, ok2 := r.find("line-floor", w, n)
			if !ok1 || !ok2 {
				continue
			}
			var side float64
			for _, p := range sc.Procs {
				if p.Role == "sidecar" {
					side = p.USPerCycle
				}
			}
			if side <= 0 || lf.ServerCPUus <= 0 {
				continue
			}
			rows = append(rows, fmt.Sprintf("| %s | %d | %.1f | %.1f | %.2f× | %.0f | %.0f |", w, n, side, lf.ServerCPUus, side/lf.ServerCPUus,
				sc.OpsPerS, lf.OpsPerS))
		}
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("## The sidecar against the line floor\n\n")
	b.WriteString("The `ticketing sidecar` process's CPU per cycle beside the line floor's (`line-floor`: the same lines on a unix socket " +
		"answered by a server of the lab's doing the least Go can per request, with no cluster behind it). The difference is what the " +
		"sidecar adds to the socket I/O any sidecar speaking this protocol pays: the broker, its TLS connection to the leader, its bookkeeping.\n\n")
	b.WriteString("| workload | clients | sidecar µs/cycle | line floor µs/cycle | sidecar ÷ floor | sidecar cycles/s (whole system) | line floor cycles/s |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	b.WriteString(strings.Join(rows, "\n") + "\n\n")
}
