package verify

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"ticketing/unixapi"
)

// The long queues of the kill-leader-queues fault (issue 31). Before the
// leader is killed, the nemesis builds a line on each of a few fresh keys
// (line/<round>/<k>): a holder takes the key, then waiters queue behind it
// one at a time, alternating keys and sidecars, each on its own unix
// session (lineConn, `HELLO 7 events`) and each confirmed by its
// `! QUEUED` event before the next is sent, so the queue order of every key
// is known and the per-key FIFO check (checker_fifo.go) judges every grant
// of the line exactly. On sessions that agreed version 7 the kill waits
// until every waiter was told its place (`! POSITION`, issue 41). After
// the kill and the restart the holders release (the first key's at once,
// again while no leader may serve yet; every other key's once its waiters
// were told their places again by the new leader), and each granted waiter
// releases at once, so the line drains in its order. The place check
// (checker_position.go) pins every place told while the line stood still
// — before the kill and after it — to the unit. Every request is recorded in the
// history like a worker's, under worker numbers of its own (LineWorkerBase
// up), so every other check covers the line too.
//
// With sidecar sessions the line survives the leader: every waiter is
// granted, in order. Without them a new leader drops every waiter, which
// its caller learns as INDETERMINATE, and the summary shows that cost.

// Line defaults (Config.LineKeys, Config.LineWaiters).
const (
	DefaultLineKeys    = 2
	DefaultLineWaiters = 6
)

// Line timings: a holder's lease outlasts the fault (at most about 4 s
// down, then an election) so that the line waits through it; a waiter's
// wait outlasts the line's drain; a granted waiter releases at once.
const (
	lineHolderLease = 10 * time.Second
	lineWaiterLease = 2 * time.Second
	lineWait        = 20 * time.Second
	// lineQueuedWait bounds the wait for a waiter's `! QUEUED` before the
	// next one is sent (a leader change may swallow the event: then the
	// order of these two waiters is not known, which the check allows).
	lineQueuedWait = 5 * time.Second
	// lineReleaseFor bounds how long a holder keeps trying to release (its
	// lease ends the holding anyway).
	lineReleaseFor = 30 * time.Second
)

// LineWorkerBase is the first worker number of the line's sessions, well
// above the workload's.
const LineWorkerBase = 100_000

// lineClient is one unix session of the line, recording into the history.
type lineClient struct {
	n       *nemesis
	id      int // worker number
	sidecar int // 1-based
	lc      *lineConn
	seq     atomic.Int64 // the reader goroutine numbers the positions it records too
	lastCmp int64
	// A waiter's key, whether its ACQUIRE still waits, and when its last
	// `! POSITION` was read (issue 41: drain waits for the new leader's).
	key     string
	waiting atomic.Bool
	lastPos atomic.Int64
}

// nextID numbers the session's next op.
func (c *lineClient) nextID() int64 { return int64(c.id+1)<<32 | c.seq.Add(1) }

func (c *lineClient) emit(op Op) Op {
	if op.ID == 0 {
		op.ID = c.nextID()
	}
	op.Worker, op.Sidecar = c.id, c.sidecar
	c.n.h.Add(op)
	return op
}

// dialLineClient opens a session of the line on sidecar j (0-based).
func (n *nemesis) dialLineClient(ctx context.Context, j int) (*lineClient, error) {
	n.mu.Lock()
	id := LineWorkerBase + n.lineClients
	n.lineClients++
	n.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lc, err := dialLine(dctx, n.p.SidecarSocket(j), nil)
	if err != nil {
		return nil, fmt.Errorf("line session on sidecar%d: %w", j+1, err)
	}
	c := &lineClient{n: n, id: id, sidecar: j + 1, lc: lc, lastCmp: time.Now().UnixNano()}
	lc.positions(func(acq int64, ev unixapi.Event, at int64, after bool) {
		c.emit(positionOp(acq, ev, at, after))
		c.lastPos.Store(at)
	})
	return c, nil
}

// acquire sends one ACQUIRE and records it; onQueued runs when its
// `! QUEUED` is read.
func (c *lineClient) acquire(ctx context.Context, key string, lease, wait time.Duration, onQueued func(int64)) Op {
	ms := wait.Milliseconds()
	op := Op{ID: c.nextID(), Kind: KindAcquire, Key: key, LeaseMs: lease.Milliseconds(), WaitMs: ms, Proto: c.lc.agreed()}
	r, sent, got, queued, err := c.lc.doAcquire(ctx, fmt.Sprintf("ACQUIRE %s %d %d.%03d", key, lease/time.Second, ms/1000, ms%1000), op.ID, onQueued)
	op.Inv, op.Cmp, op.Queued = sent, got, queued
	classifyAcquireLine(&op, r, err)
	if err == nil {
		c.lastCmp = got
	}
	return c.emit(op)
}

// release sends one RELEASE of the grant a and records it.
func (c *lineClient) release(a Op) Op {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	op := Op{Kind: KindRelease, Key: a.Key, Token: a.Token, Acq: a.ID}
	r, sent, got, err := c.lc.do(ctx, "RELEASE "+a.Key+" "+strconv.FormatUint(a.Token, 10))
	op.Inv, op.Cmp = sent, got
	classifyReleaseLine(&op, r, err)
	if err == nil {
		c.lastCmp = got
	}
	return c.emit(op)
}

// close ends the session (the sidecar releases what it still holds) and
// records that.
func (c *lineClient) close() {
	c.lc.close()
	c.emit(Op{Kind: KindClose, Inv: c.lastCmp, Cmp: time.Now().UnixNano()})
}

// lines is one round's queues.
type lines struct {
	keys    []string
	holders []*lineClient
	grants  []Op // the holders' grants, by key
	queued  int  // waiters confirmed by their `! QUEUED`
	sent    int  // waiters sent
	wg      sync.WaitGroup
	mu      sync.Mutex
	waiters []*lineClient
	answers map[string]int // the waiters' answers by result
	retold  []string       // awaitRetell's findings: "<key> <told> of <waiting>"
}

// buildLines takes a holder on each of keys fresh keys and queues waiters
// waiters behind each, one at a time (see above). It returns what it
// built, also when it could not build all of it (err says why).
func (n *nemesis) buildLines(ctx context.Context, keys, waiters int) (*lines, error) {
	n.mu.Lock()
	round := n.lineRounds
	n.lineRounds++
	n.mu.Unlock()
	ln := &lines{answers: map[string]int{}}
	for k := 0; k < keys; k++ {
		ln.keys = append(ln.keys, fmt.Sprintf("line/%d/%d", round, k))
	}
	sidecars := max(n.p.Sidecars(), 1)
	for k, key := range ln.keys {
		c, err := n.dialLineClient(ctx, k%sidecars)
		if err != nil {
			return ln, err
		}
		ln.holders = append(ln.holders, c)
		var g Op
		for try := 0; try < 50 && ctx.Err() == nil; try++ {
			// A fresh key is free; unavailable (no leader yet) is tried again.
			if g = c.acquire(ctx, key, lineHolderLease, 0, nil); g.Result == ResOK || g.Result == ResIndeterminate {
				break
			}
			sleepCtx(ctx, 100*time.Millisecond)
		}
		ln.grants = append(ln.grants, g)
		if g.Result != ResOK {
			return ln, fmt.Errorf("the holder of %s was answered %s %s", key, g.Result, g.Err)
		}
	}
	for i := 0; i < waiters; i++ {
		for k, key := range ln.keys {
			if ctx.Err() != nil {
				return ln, ctx.Err()
			}
			c, err := n.dialLineClient(ctx, (i+k)%sidecars)
			if err != nil {
				return ln, err
			}
			c.key = key
			c.waiting.Store(true)
			ln.mu.Lock()
			ln.waiters = append(ln.waiters, c)
			ln.mu.Unlock()
			ln.sent++
			queued, answered := make(chan struct{}), make(chan struct{})
			var once sync.Once
			ln.wg.Add(1)
			go func() {
				defer ln.wg.Done()
				defer close(answered)
				// The line outlives the nemesis's context: it drains after
				// the kill whatever happens (bounded by the wait).
				actx, cancel := context.WithTimeout(context.Background(), lineWait+30*time.Second)
				a := c.acquire(actx, key, lineWaiterLease, lineWait, func(int64) { once.Do(func() { close(queued) }) })
				c.waiting.Store(false)
				cancel()
				ln.mu.Lock()
				ln.answers[a.Result]++
				ln.mu.Unlock()
				if a.Result == ResOK {
					time.Sleep(min(n.lineHold, lineWaiterLease/2)) // within its lease
					c.release(a)
				}
			}()
			if c.lc.agreed() < 4 {
				// No `! QUEUED` from a version-3 sidecar: the order is a
				// guess, which the FIFO check does not rely on.
				sleepCtx(ctx, 50*time.Millisecond)
				continue
			}
			t := time.NewTimer(lineQueuedWait)
			select {
			case <-queued:
				ln.queued++
			case <-answered:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
	}
	ln.awaitTold(ctx)
	return ln, nil
}

// awaitTold waits until every waiter that still waits was told its place
// (at most lineToldWait; not for sessions without places), so that the
// kill comes after the old leader told each its place, and the new
// leader's places can be held against them (issue 41).
func (ln *lines) awaitTold(ctx context.Context) {
	deadline := time.Now().Add(lineToldWait)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		all := true
		ln.mu.Lock()
		for _, c := range ln.waiters {
			if c.waiting.Load() && c.lc.agreed() >= lineVersionPositions && c.lastPos.Load() == 0 {
				all = false
			}
		}
		ln.mu.Unlock()
		if all {
			return
		}
		sleepCtx(ctx, 25*time.Millisecond)
	}
}

// drain releases the holders' keys (trying again while no leader serves,
// within lineReleaseFor), waits until every waiter was answered (and
// released its grant), and closes every session of the line. killAt is
// when the leader was killed: the holder of every other key (the second,
// the fourth, ...) first waits until that key's waiters were told their
// places again by the new leader (awaitRetell), so that the places kept
// across the kill are seen while the line stands still (issue 41); the
// first key's holder releases at once, while no leader may serve yet.
func (ln *lines) drain(killAt int64) {
	for k, c := range ln.holders {
		if k >= len(ln.grants) || ln.grants[k].Result != ResOK {
			continue
		}
		if k%2 == 1 {
			ln.awaitRetell(ln.keys[k], killAt)
		}
		deadline := time.Now().Add(lineReleaseFor)
		for {
			rel := c.release(ln.grants[k])
			if rel.Result == ResOK || rel.Result == ResError && definiteReleaseError(rel.Err) || time.Now().After(deadline) || isClosed(c.lc) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	done := make(chan struct{})
	go func() { ln.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(lineWait + 40*time.Second):
		// A hang guard: the waits have long run out. Closing the sessions
		// ends every request still pending (INDETERMINATE).
		ln.mu.Lock()
		for _, c := range ln.waiters {
			c.lc.c.Close()
		}
		ln.mu.Unlock()
		<-done
	}
	for _, c := range ln.holders {
		c.close()
	}
	ln.mu.Lock()
	defer ln.mu.Unlock()
	for _, c := range ln.waiters {
		c.close()
	}
}

// Waiting for the new leader's places (awaitRetell): at most
// lineRetellWait after the restart (a holder's lease outlasts it: a new
// leader re-arms a full lease for every holder); a place read within
// lineStaleFrames of the kill may still be the dead leader's. The new
// leader tells every waiter its place again, but the line stood still, so
// the sidecar passes none on (it writes a place only when it changed): the
// wait gives a wrong place of the new leader's the time to show, where the
// still line pins it, and is otherwise spent.
const (
	lineRetellWait  = 1500 * time.Millisecond
	lineStaleFrames = 250 * time.Millisecond
	// lineToldWait bounds awaitTold: a few of the lab's position
	// intervals, or two of the product's 1 s.
	lineToldWait = 2500 * time.Millisecond
)

// awaitRetell waits until every waiter of key that still waits was told
// its place after the kill (killAt + lineStaleFrames), at most
// lineRetellWait; not at all for waiters on sessions that did not agree
// version 7 (an older sidecar tells no places). It records what it saw
// for describe.
func (ln *lines) awaitRetell(key string, killAt int64) {
	ln.mu.Lock()
	var ws []*lineClient
	for _, c := range ln.waiters {
		if c.key == key && c.lc.agreed() >= lineVersionPositions {
			ws = append(ws, c)
		}
	}
	ln.mu.Unlock()
	if len(ws) == 0 {
		return
	}
	since := killAt + int64(lineStaleFrames)
	deadline := time.Now().Add(lineRetellWait)
	for {
		told, waiting := 0, 0
		for _, c := range ws {
			if c.waiting.Load() {
				waiting++
				if c.lastPos.Load() > since {
					told++
				}
			}
		}
		if told == waiting || time.Now().After(deadline) {
			ln.mu.Lock()
			ln.retold = append(ln.retold, fmt.Sprintf("%s %d of %d", key, told, waiting))
			ln.mu.Unlock()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// describe says what was built and how the waiters were answered.
func (ln *lines) describe() string {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	var parts []string
	for _, res := range []string{ResOK, ResTimeout, ResIndeterminate, ResBusy, ResError} {
		if c := ln.answers[res]; c > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", res, c))
		}
	}
	if len(parts) == 0 {
		parts = []string{"none yet"}
	}
	retold := ""
	if len(ln.retold) > 0 {
		retold = "; told their places again by the new leader before the holder released: " + strings.Join(ln.retold, ", ")
	}
	return fmt.Sprintf("%d waiters on %s (%d confirmed queued); answered: %s%s",
		ln.sent, strings.Join(ln.keys, ","), ln.queued, strings.Join(parts, ", "), retold)
}
