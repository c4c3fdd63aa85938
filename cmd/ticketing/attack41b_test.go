package main

// Attack round 41b: the fixes of round 41, attacked on real `ticketing
// node` processes and a real `ticketing sidecar` (helpers in
// attack41_test.go).

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/crc64"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
)

// a41bHello dials the sidecar and agrees version 8 (PERMIT).
func a41bHello(t *testing.T, sock string) *a41Line {
	t.Helper()
	l := a41Dial(t, sock)
	l.send("HELLO 8")
	if r := l.read(30 * time.Second); !strings.HasPrefix(r, "HELLO 8") {
		t.Fatalf("HELLO 8: %q", r)
	}
	return l
}

// Finding: admitRaise counts the grants a raise may make from the queue
// the table holds when the raise is admitted. Permit acquires proposed
// just before it (admitted, counted as fresh holdings while in flight)
// are not in that queue yet: when they apply they queue, stop counting,
// and leave room that other acquires are admitted into; then the raise
// applies and grants them all. Each round frees exactly 2+W holdings of
// a full table, defines a semaphore of 1 and takes its permit, sends W
// permit waiters and, d later, raises n to 1000 while a filler takes
// every fresh lock it is admitted for. Correct: the W waiters and the
// filler share the W free holdings.
func TestAttack41bRaiseRacingPermitAcquiresOvershootsMaxKeys(t *testing.T) {
	const (
		rounds = 30
		w      = 6
		spare  = 6
	)
	reserveN := rounds * (2 + w)
	maxKeys := reserveN + spare
	_, sock := a41Procs(t, "--max-keys", strconv.Itoa(maxKeys))
	op := a41bHello(t, sock)
	if r := a41SetPermits(t, op, "warm", 1); r != "OK" { // cluster version 13
		t.Fatalf("PERMITS warm 1: %q", r)
	}
	op.send("PERMITS warm 0")
	if r := op.reply(30 * time.Second); r != "OK" {
		t.Fatalf("PERMITS warm 0: %q", r)
	}
	reserve := a41bHello(t, sock)
	var reserveTok []string
	for i := range reserveN {
		reserve.send(fmt.Sprintf("ACQUIRE r%d 240 0", i))
		r := reserve.reply(30 * time.Second)
		if !strings.HasPrefix(r, "OK ") {
			t.Fatalf("reserve %d: %q", i, r)
		}
		reserveTok = append(reserveTok, strings.Fields(r)[1])
	}
	filler := a41bHello(t, sock)
	fillerN := 0
	fill := func(stop func() bool) int {
		got := 0
		for !stop() {
			filler.send(fmt.Sprintf("ACQUIRE f%d 240 0", fillerN))
			r := filler.reply(30 * time.Second)
			switch {
			case strings.HasPrefix(r, "OK "):
				fillerN++
				got++
			case strings.HasPrefix(r, "ERR too_many_keys"):
			default:
				t.Errorf("filler: %q", r)
				return got
			}
		}
		return got
	}
	// Fill the table: the spare holdings.
	if got := fill(func() bool { return fillerN >= spare }); got != spare {
		t.Fatalf("filled %d, want %d", got, spare)
	}
	filler.send("ACQUIRE fx 240 0")
	if r := filler.reply(30 * time.Second); !strings.HasPrefix(r, "ERR too_many_keys") {
		t.Fatalf("a full table took another lock: %q", r)
	}
	held := reserveN + spare
	ri := 0
	for round := range rounds {
		d := time.Duration(round%5) * 100 * time.Microsecond
		for range 2 + w {
			reserve.send(fmt.Sprintf("RELEASE r%d %s", ri, reserveTok[ri]))
			if r := reserve.reply(30 * time.Second); r != "OK" {
				t.Fatalf("release r%d: %q", ri, r)
			}
			ri++
			held--
		}
		key := fmt.Sprintf("s%d", round)
		op.send("PERMITS " + key + " 1")
		if r := op.reply(30 * time.Second); r != "OK" {
			t.Fatalf("PERMITS %s 1: %q", key, r)
		}
		op.send("PERMIT " + key + " 240 0")
		if r := op.reply(30 * time.Second); !strings.HasPrefix(r, "OK ") {
			t.Fatalf("PERMIT %s: %q", key, r)
		}
		held += 2
		var ws []*a41Line
		for range w {
			ws = append(ws, a41bHello(t, sock))
		}
		for _, x := range ws {
			x.send("PERMIT " + key + " 240 2")
		}
		time.Sleep(d)
		op.send("PERMITS " + key + " 1000")
		var stop atomic.Bool
		var fgot int
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); fgot = fill(stop.Load) }()
		raise := op.reply(30 * time.Second)
		var wgot int
		var wreplies []string
		for _, x := range ws {
			r := x.reply(10 * time.Second)
			wreplies = append(wreplies, r)
			if strings.HasPrefix(r, "OK ") {
				wgot++
			}
		}
		time.Sleep(200 * time.Millisecond)
		stop.Store(true)
		wg.Wait()
		held += wgot + fgot
		t.Logf("round %d (raise %v after the waiters): raise %q, waiters %q, filler took %d: %d holdings, --max-keys %d",
			round, d, raise, wreplies, fgot, held, maxKeys)
		if held > maxKeys {
			filler.send("ACQUIRE fy 240 0")
			t.Logf("the node on a fresh lock now: %q", filler.reply(30*time.Second))
			t.Fatalf("round %d: %d holdings with --max-keys %d: the raise granted %d waiters it never counted, "+
				"while the filler was admitted %d fresh locks into the room they left when they queued", round, held, maxKeys, wgot, fgot)
		}
	}
}

// a41bBlankSnapshotDomains rewrites every raft snapshot of node i's data
// dir as a cluster without a fencing domain writes it (the domain field
// "", as a cluster bootstrapped before domains existed snapshots: fsm.go
// reads version 1 snapshots, which have no domain at all, and writes ""),
// with meta.json's size and CRC to match.
func a41bBlankSnapshotDomains(t *testing.T, dir string) int {
	t.Helper()
	metas, _ := filepath.Glob(filepath.Join(dir, "snapshots", "snapshots", "*", "meta.json"))
	for _, mp := range metas {
		sp := filepath.Join(filepath.Dir(mp), "state.bin")
		b, err := os.ReadFile(sp)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 6 || string(b[:4]) != "TKSN" || b[4] < 2 {
			t.Fatalf("%s: not a version 2+ snapshot: % x", sp, b[:min(len(b), 8)])
		}
		dl := int(b[5])
		nb := append(append([]byte(nil), b[:5]...), 0)
		nb = append(nb, b[6+dl:]...)
		if err := os.WriteFile(sp, nb, 0o600); err != nil {
			t.Fatal(err)
		}
		var meta map[string]any
		mb, err := os.ReadFile(mp)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(mb, &meta); err != nil {
			t.Fatal(err)
		}
		h := crc64.New(crc64.MakeTable(crc64.ECMA))
		h.Write(nb)
		meta["Size"] = len(nb)
		meta["CRC"] = base64.StdEncoding.EncodeToString(h.Sum(nil))
		if mb, err = json.Marshal(meta); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(mp, mb, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: domain %q blanked", sp, b[6:6+dl])
	}
	return len(metas)
}

// Finding (regression of the awaitDomain fix): a node now refuses every
// client handshake until it knows its fencing domain, but a cluster can
// have none for good: one bootstrapped before domains existed (fsm.go
// still reads version 1 snapshots, which carry none, and only bootstrap
// ever writes a 'D' entry) restores "" from its snapshot and never
// applies a 'D' again. After an upgrade to this build every node of such
// a cluster elects a leader and serves its peers, and no client can ever
// connect: each handshake waits 4.5 s and fails with handshake_timeout.
// Before, clients connected (domain "", fence helpers refusing with
// ErrNoDomain, as documented). Here: a cluster whose every snapshot says
// domain "" (as such a cluster writes them), all nodes SIGKILLed and
// restarted from them, and a fresh sidecar.
func TestAttack41bDomainlessClusterRefusesEveryClientForever(t *testing.T) {
	p, sock := a41Procs(t, "--snapshot-threshold", "1024", "--snapshot-interval", "1s")
	gen := a41Dial(t, sock)
	const window = 4
	room := make(chan struct{}, window)
	stop := make(chan struct{})
	go func() {
		for i := 0; ; i++ {
			select {
			case room <- struct{}{}:
			case <-stop:
				return
			}
			if _, err := gen.c.Write([]byte(fmt.Sprintf("ACQUIRE g%d 1 0\n", i))); err != nil {
				return
			}
		}
	}()
	snapped := func() bool {
		for i := range p.Size() {
			if a41Snapshots(p, i) == 0 {
				return false
			}
		}
		return true
	}
	start := time.Now()
	for !snapped() {
		if time.Since(start) > 120*time.Second {
			t.Fatal("no snapshot on every node")
		}
		if r := gen.reply(60 * time.Second); !strings.HasPrefix(r, "OK ") {
			t.Fatalf("acquire: %q", r)
		}
		<-room
	}
	close(stop)
	t.Logf("a snapshot on every node after %v", time.Since(start))
	if err := p.SignalSidecar(0, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := range p.Size() {
		if err := p.Signal(i, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	for i := range p.Size() {
		a41bBlankSnapshotDomains(t, p.DataDir(i))
	}
	for i := range p.Size() {
		if err := p.Start(i); err != nil {
			t.Fatal(err)
		}
	}
	// (localproc's Leader asks each node's status over its client port:
	// it cannot reach them either.)
	if err := p.StartSidecar(0); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	if err := ticketing.WaitReady(rctx, sock); err != nil {
		log, _ := os.ReadFile(p.LogFile(0))
		tail := string(log)
		if n := strings.LastIndex(tail, "client admission refused"); n >= 0 {
			tail = tail[n:min(len(tail), n+400)]
		} else {
			tail = ""
		}
		t.Fatalf("a domainless cluster restarted, and for 20 s no client reaches it: %v\nnode 0 log: %s", err, tail)
	}
}
