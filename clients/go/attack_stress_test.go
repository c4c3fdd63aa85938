package ticketing

import (
	"context"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Random interleavings of concurrent Extends of one
// Lock (goroutines, some abandoning their call by ctx at random moments)
// against a sidecar that answers in order with random outcomes, at random
// moments. After each round the Lock's deadline must be at most the end
// (receive time + lease − Margin) of every EXTEND that may have applied
// last: one not followed by an OK EXTEND that the sidecar received after
// it had answered it.
func TestAttackStressConcurrentExtends(t *testing.T) {
	rounds := 150
	if testing.Short() {
		rounds = 20
	}
	for seed := 1; seed <= rounds; seed++ {
		stressRound(t, int64(seed))
	}
}

type stressRec struct {
	lease   time.Duration
	recv    time.Time
	answer  time.Time
	outcome string
}

func stressRound(t *testing.T, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	c, f := pipeClient(t, "HELLO 3 events")
	l := takeLock(t, c, f, "k", 200*time.Second, nil, "OK 5")
	n := 2 + rng.Intn(5)
	var mu sync.Mutex
	var pending []*stressRec
	var recs []*stressRec
	received := 0
	base := c.sent.Load() // HELLO, ACQUIRE
	go func() {
		for line := range f.reqs {
			if !strings.HasPrefix(line, "EXTEND") {
				continue
			}
			s, _ := strconv.Atoi(strings.Fields(line)[3])
			mu.Lock()
			pending = append(pending, &stressRec{lease: time.Duration(s) * time.Second, recv: time.Now()})
			received++
			mu.Unlock()
		}
	}()
	var wg sync.WaitGroup
	started := 0
	var returned atomic.Int64
	busy := func() bool { // an Extend under way, a line on its way, or one to answer
		mu.Lock()
		defer mu.Unlock()
		return returned.Load() < int64(started) || uint64(received) < c.sent.Load()-base || len(pending) > 0
	}
	for started < n || busy() {
		if started < n && rng.Intn(2) == 0 {
			lease := time.Duration(1+rng.Intn(199)) * time.Second
			ctx, cancel := context.WithCancel(context.Background())
			abandon := rng.Intn(4) == 0
			d := time.Duration(rng.Intn(3)) * time.Millisecond
			wg.Add(2)
			go func() { defer wg.Done(); _ = l.Extend(ctx, lease); cancel(); returned.Add(1) }()
			go func() {
				defer wg.Done()
				if abandon {
					time.Sleep(d)
					cancel()
				}
			}()
			started++
		} else {
			mu.Lock()
			if len(pending) > 0 {
				r := pending[0]
				pending = pending[1:]
				switch o := rng.Intn(10); {
				case o < 6:
					r.outcome = "OK"
				case o < 8:
					r.outcome = "INDETERMINATE"
				default:
					r.outcome = "ERR unavailable x"
				}
				r.answer = time.Now()
				recs = append(recs, r)
				f.write(r.outcome)
			}
			mu.Unlock()
		}
		if rng.Intn(2) == 0 {
			time.Sleep(time.Duration(rng.Intn(3)) * 500 * time.Microsecond)
		}
	}
	wg.Wait()
	// Every Extend call returned: the deadline is what they set.
	now := time.Now()
	deadline := now.Add(l.Remaining())
	var bound time.Time
	for _, e := range recs {
		superseded := false
		for _, g := range recs {
			if g != e && g.outcome == "OK" && g.recv.After(e.answer) {
				superseded = true
			}
		}
		if end := e.recv.Add(e.lease - Margin(e.lease)); !superseded && (bound.IsZero() || end.Before(bound)) {
			bound = end
		}
	}
	if !bound.IsZero() && deadline.After(bound.Add(time.Millisecond)) {
		var desc []string
		for _, r := range recs {
			desc = append(desc, r.lease.String()+":"+r.outcome)
		}
		t.Fatalf("seed %d: deadline in %v, want at most %v (the end of an EXTEND that may have applied last); %v",
			seed, deadline.Sub(now), bound.Sub(now), desc)
	}
	c.Close()
}
