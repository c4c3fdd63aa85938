// End-to-end tests, on three real nodes of version 7 over TCP, of what the
// broker's cluster session does with requests whose reply a lost
// connection or a stopped leader swallowed (docs/sessions.md, "The broker
// as built"): a ghost grant (committed, its G lost, its caller gone before
// the resume) is released at once by its token; a request the leader
// never applied is void at the resume and, while its caller waits, sent
// again as a new request. The faults are message-level (netfault.Frames
// on the broker's cluster connections): the product code has no hooks.
// The unix-socket side of a ghost grant is in compensation_unix_e2e_test.go.
package sidecar

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/local"
	"ticketing/cluster/netfault"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// frameSeen is what a Frames rule saw and did.
type frameSeen struct {
	acquires  []netfault.Frame // acquires of the test's key, in order
	releases  []netfault.Frame // releases of the test's key, in order
	resumes   []netfault.Frame // y frames that passed
	heldY     int              // y frames held
	ghostTok  uint64           // the token of the G the rule took away
	yBeforeSt int              // y frames that passed before the stop
}

// frameLog is a Frames rule's memory, for the test to read.
type frameLog struct {
	mu sync.Mutex
	frameSeen
	holdY   bool        // hold every y until Frames.Release
	stopped bool        // the leader was stopped (set by the test)
	event   chan string // what the rule did, for the test to wait on
}

func newFrameLog() *frameLog { return &frameLog{event: make(chan string, 64)} }

func (l *frameLog) tell(what string) {
	select {
	case l.event <- what:
	default:
	}
}

// await waits for the rule to tell what.
func (l *frameLog) await(t *testing.T, what string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case got := <-l.event:
			if got == what {
				return
			}
		case <-deadline:
			t.Fatalf("the fault never happened: %s", what)
		}
	}
}

// resumeLocked is the y rule: held while holdY, recorded when it passes.
func (l *frameLog) resumeLocked(fr netfault.Frame) netfault.Verdict {
	if l.holdY {
		l.heldY++
		l.tell("y held")
		return netfault.Hold
	}
	l.resumes = append(l.resumes, fr)
	if !l.stopped {
		l.yBeforeSt++
	}
	return netfault.Pass
}

func (l *frameLog) set(f func(l *frameLog)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(l)
}

func (l *frameLog) get() frameSeen {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.frameSeen
	c.acquires = append([]netfault.Frame(nil), c.acquires...)
	c.releases = append([]netfault.Frame(nil), c.releases...)
	c.resumes = append([]netfault.Frame(nil), c.resumes...)
	return c
}

// startFramesCluster starts three version 7 nodes and a broker whose
// cluster connections go through f.
func startFramesCluster(t *testing.T, f *netfault.Frames, tune ...func(*Config)) (*local.Cluster, *Broker) {
	t.Helper()
	return startSessionCluster(t, append([]func(*Config){func(cfg *Config) { cfg.Dialer = f.Dial }}, tune...)...)
}

// waitFloor waits until every running node's replicated state has the
// session's floor at seq or above: a stray copy of seq can never apply.
func waitFloor(t *testing.T, c *local.Cluster, sid, seq uint64) {
	t.Helper()
	for i := range c.Size() {
		n := c.Node(i)
		if n == nil {
			continue
		}
		testkit.WaitFor(t, "the session's floor replicated", 20*time.Second, func() bool {
			var floor uint64
			n.ReadState(func(st *locksm.State) {
				if si, ok := st.Session(sid); ok {
					floor = si.Floor
				}
			})
			return floor >= seq
		})
	}
}

// strayCopyNeverApplies applies, to a copy of node i's replicated state, a
// stray copy of the session's acquire seq for a free key (as an old leader
// that regained leadership with it unread would propose it): the state
// machine refuses it ErrVoided and nothing changes, while the same acquire
// under a fresh seq would be granted (so the refusal is the floor's).
func strayCopyNeverApplies(t *testing.T, c *local.Cluster, i int, sid, seq uint64) {
	t.Helper()
	copyOf := func() *locksm.State {
		var buf bytes.Buffer
		var err error
		c.Node(i).ReadState(func(st *locksm.State) { err = st.WriteSnapshot(&buf) })
		if err != nil {
			t.Fatal(err)
		}
		st, err := locksm.ReadSnapshot(&buf)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	cmd := locksm.Command{Op: locksm.OpAcquire, Now: time.Now().UnixMilli(), Key: "stray", Owner: "me", LeaseSec: 60,
		Ref: 1 << 40, Session: sid, Seq: seq}
	st := copyOf()
	last := st.LastToken()
	if res, _ := st.Apply(cmd, nil); !errors.Is(res.Err, locksm.ErrVoided) {
		t.Fatalf("a stray copy of seq %d applied: %+v, want ErrVoided", seq, res)
	}
	if _, held := st.Holder("stray"); held || st.LastToken() != last {
		t.Fatalf("the voided stray copy changed the state: held %v, last token %d -> %d", held, last, st.LastToken())
	}
	si, _ := st.Session(sid)
	cmd.Seq = max(si.Floor, seq) + 1000
	if res, _ := copyOf().Apply(cmd, nil); res.Status != locksm.StatusGranted {
		t.Fatalf("control: the same acquire under the fresh seq %d: %+v, want granted", cmd.Seq, res)
	}
}

// A ghost grant whose leader stops: the acquire commits, its G is held
// back on the leader's connection until the leader stops (so it is lost
// with it), the caller's wait + ReplyGrace passes (Indeterminate), and
// only then does the broker resume, on the new leader, which answers the
// recorded grant: the broker releases it at once by its token. Another
// caller gets the key with a larger token within a wait much shorter
// than the ghost's lease, so the key was released, not left to its lease.
func TestE2EGhostGrantAtStoppedLeaderIsReleased(t *testing.T) {
	l := newFrameLog()
	f := netfault.NewFrames(nil)
	c, b := startFramesCluster(t, f, func(cfg *Config) { cfg.ReplyGrace = 500 * time.Millisecond })
	li := leaderOf(t, c)
	var ghostConn uint64
	f.SetRule(func(fr netfault.Frame) netfault.Verdict {
		l.mu.Lock()
		defer l.mu.Unlock()
		m := fr.Msg
		switch {
		case fr.Dir == netfault.Sent && m.Type == wire.TypeAcquire && m.Key == "k":
			l.acquires = append(l.acquires, fr)
			if len(l.acquires) == 1 {
				ghostConn = fr.Conn
			}
		case fr.Dir == netfault.Received && m.Type == wire.TypeGranted && fr.Conn == ghostConn && l.ghostTok == 0 &&
			len(l.acquires) == 1 && m.ID == l.acquires[0].Msg.ID:
			l.ghostTok = m.Token
			l.tell("G held")
			return netfault.Hold // lost when the leader stops
		case fr.Dir == netfault.Sent && m.Type == wire.TypeResume:
			return l.resumeLocked(fr)
		}
		return netfault.Pass
	})
	ctx := ctxT(t, 90*time.Second)
	const lease = 60 * time.Second
	if _, err := b.Acquire(ctx, "k", "ghost", lease, 0); !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("acquire whose G is held back: %v, want ErrIndeterminate (its wait + ReplyGrace passed)", err)
	}
	l.await(t, "G held")
	ghost := l.get().ghostTok
	if h, ok := holder(c, li, "k"); !ok || h.Token != ghost || h.Owner != "ghost" {
		t.Fatalf("the ghost grant should have committed under token %d: %+v %v", ghost, h, ok)
	}
	if si := b.Info().Session; si == nil || si.Resumes != 0 {
		t.Fatalf("resumed before the leader stopped: %+v", si)
	}
	l.set(func(l *frameLog) { l.stopped = true })
	c.Stop(li)
	leaderOf(t, c)
	waitResumed(t, b)
	// The key is free long before the ghost's lease would have ended it.
	lk, err := b.Acquire(ctx, "k", "next", lease, 20*time.Second)
	if err != nil {
		t.Fatalf("another caller, waiting 20 s for a key whose ghost holds a %v lease: %v", lease, err)
	}
	if lk.Token <= ghost {
		t.Fatalf("token %d after the ghost's %d", lk.Token, ghost)
	}
	fl := l.get()
	if fl.yBeforeSt != 0 || len(fl.resumes) == 0 {
		t.Fatalf("resumes %d before the stop, %d in all: the resume should have come after the stop only", fl.yBeforeSt, len(fl.resumes))
	}
	for _, y := range fl.resumes {
		if y.Addr == c.ClientAddr(li) {
			t.Fatalf("a resume went to the stopped leader %s", y.Addr)
		}
	}
	if si := b.Info().Session; si.LastResume.Outcomes < 1 {
		t.Errorf("the resume answered %+v, want the ghost's outcome", si.LastResume)
	}
	reg := b.MetricsRegistry()
	wantValue(t, reg, 1, "ticketing_sidecar_late_grants_total")
	testkit.WaitFor(t, "the compensation counted", 10*time.Second, func() bool {
		return metricValue(t, reg, "ticketing_sidecar_compensations_total", "result", "ok") == 1
	})
	if v := metricValue(t, reg, "ticketing_sidecar_session_resumed_requests_total", "answer", "outcome"); v < 1 {
		t.Errorf("resumed requests answered by an outcome: %v, want >= 1", v)
	}
}

// An acquire the leader never applied is void at the resume and, while
// its caller waits, sent again as a new request (a new seq above the
// resume's): the caller gets its grant, exactly one grant is made, the
// void counter moves, and the void seq can never apply (the session's
// floor, replicated). Two ways for the leader never to apply it: the
// frame is lost on the way with its connection (the resume goes to the
// same leader), or held back until the leader stops (a new one).
func TestE2EVoidAcquireIsSentAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop bool
	}{{"lost on the way", false}, {"leader stopped before appending it", true}} {
		t.Run(tc.name, func(t *testing.T) {
			l := newFrameLog()
			f := netfault.NewFrames(nil)
			c, b := startFramesCluster(t, f)
			li := leaderOf(t, c)
			f.SetRule(func(fr netfault.Frame) netfault.Verdict {
				l.mu.Lock()
				defer l.mu.Unlock()
				m := fr.Msg
				switch {
				case fr.Dir == netfault.Sent && m.Type == wire.TypeAcquire && m.Key == "v":
					l.acquires = append(l.acquires, fr)
					if len(l.acquires) == 1 {
						if tc.stop {
							l.tell("a held")
							return netfault.Hold // lost when the leader stops
						}
						return netfault.Cut
					}
				case fr.Dir == netfault.Sent && m.Type == wire.TypeResume:
					return l.resumeLocked(fr)
				}
				return netfault.Pass
			})
			sid := b.Info().Session.ID
			first := c.Node(li).LastToken()
			ctx := ctxT(t, 90*time.Second)
			type res struct {
				lk  Lock
				err error
			}
			got := make(chan res, 1)
			go func() {
				lk, err := b.Acquire(ctx, "v", "me", 60*time.Second, 20*time.Second)
				got <- res{lk, err}
			}()
			nl := li
			if tc.stop {
				l.await(t, "a held")
				l.set(func(l *frameLog) { l.stopped = true })
				c.Stop(li)
				nl = leaderOf(t, c)
			}
			var r res
			select {
			case r = <-got:
			case <-ctx.Done():
				t.Fatal("the acquire was never answered")
			}
			if r.err != nil {
				t.Fatalf("acquire void at the resume, its caller still waiting: %v, want the grant", r.err)
			}
			fl := l.get()
			if len(fl.acquires) != 2 || len(fl.resumes) == 0 {
				t.Fatalf("%d acquires and %d resumes written, want the void one, a resume, and one sent again",
					len(fl.acquires), len(fl.resumes))
			}
			void, again, y := fl.acquires[0].Msg, fl.acquires[1].Msg, fl.resumes[len(fl.resumes)-1].Msg
			if y.High < void.ID || again.ID <= y.ID {
				t.Fatalf("void seq %d, resume %d (high %d), sent again as %d: want high >= void and a new seq above the resume",
					void.ID, y.ID, y.High, again.ID)
			}
			// Exactly one grant: the void acquire never applied.
			if h, ok := holder(c, nl, "v"); !ok || h.Token != r.lk.Token || h.Owner != "me" {
				t.Fatalf("holder %+v %v, want the caller's token %d", h, ok, r.lk.Token)
			}
			if last := c.Node(nl).LastToken(); last != first+1 || r.lk.Token != last {
				t.Fatalf("tokens went from %d to %d, the grant is %d: want exactly one grant", first, last, r.lk.Token)
			}
			si := b.Info().Session
			if si.LastResume.Void != 1 {
				t.Errorf("the resume answered %+v, want one void", si.LastResume)
			}
			reg := b.MetricsRegistry()
			wantValue(t, reg, 1, "ticketing_sidecar_void_acquires_resent_total")
			wantValue(t, reg, 1, "ticketing_sidecar_session_resumed_requests_total", "answer", "void")
			wantValue(t, reg, 1, "ticketing_sidecar_acquires_total", "result", "granted")
			wantValue(t, reg, 0, "ticketing_sidecar_late_grants_total")
			waitFloor(t, c, sid, void.ID)
			strayCopyNeverApplies(t, c, nl, sid, void.ID)
		})
	}
}

// A release the leader never applied (its frame lost on the way with its
// connection) is void at the resume and sent again within its deadline,
// as a new request; it counts as done only on the success reply of that
// one, and a definite refusal of it is what it says: the void attempt
// never ran, so it does not make a not_held Indeterminate.
func TestE2EVoidReleaseIsSentAgain(t *testing.T) {
	for _, tc := range []struct {
		name      string
		leaseEnds bool // hold the second attempt until the lease ended
	}{{"success reply", false}, {"the lease ended meanwhile", true}} {
		t.Run(tc.name, func(t *testing.T) {
			l := newFrameLog()
			f := netfault.NewFrames(nil)
			// A deadline with room for the lease to end while the second
			// attempt is held; the mechanism does not depend on its length.
			c, b := startFramesCluster(t, f, func(cfg *Config) { cfg.ReleaseDeadline = 30 * time.Second })
			li := leaderOf(t, c)
			ctx := ctxT(t, 90*time.Second)
			lease := 60 * time.Second
			if tc.leaseEnds {
				lease = time.Second
			}
			lk, err := b.Acquire(ctx, "r", "me", lease, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.SetRule(func(fr netfault.Frame) netfault.Verdict {
				l.mu.Lock()
				defer l.mu.Unlock()
				m := fr.Msg
				switch {
				case fr.Dir == netfault.Sent && m.Type == wire.TypeRelease && m.Key == "r":
					l.releases = append(l.releases, fr)
					switch len(l.releases) {
					case 1:
						return netfault.Cut // never reaches the leader
					case 2:
						l.tell("sent again")
						return netfault.Hold // until the test has looked
					}
				case fr.Dir == netfault.Sent && m.Type == wire.TypeResume:
					return l.resumeLocked(fr)
				}
				return netfault.Pass
			})
			errc := make(chan error, 1)
			go func() { errc <- b.Release(ctx, lk) }()
			l.await(t, "sent again")
			// The second attempt is written only after the resume said
			// void; its reply cannot have come.
			select {
			case err := <-errc:
				t.Fatalf("release answered (%v) before the reply of the attempt sent again", err)
			default:
			}
			if si := b.Info().Session; si.LastResume.Void != 1 {
				t.Errorf("the resume answered %+v, want one void", si.LastResume)
			}
			fl := l.get()
			void, again, y := fl.releases[0].Msg, fl.releases[1].Msg, fl.resumes[len(fl.resumes)-1].Msg
			if y.High < void.ID || again.ID <= y.ID || again.Token != lk.Token {
				t.Fatalf("void release %d, resume %d (high %d), sent again %+v", void.ID, y.ID, y.High, again)
			}
			if !tc.leaseEnds {
				if h, ok := holder(c, li, "r"); !ok || h.Token != lk.Token {
					t.Fatalf("the void release applied: holder %+v %v", h, ok)
				}
			} else {
				testkit.WaitFor(t, "the lease ended", 30*time.Second, func() bool {
					_, held := holder(c, li, "r")
					return !held
				})
			}
			f.Release()
			err = <-errc
			if tc.leaseEnds {
				if !errors.Is(err, locksm.ErrNotHeld) || errors.Is(err, ErrIndeterminate) {
					t.Fatalf("release whose lease ended before its only applied attempt: %v, want a definite not_held", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("release sent again after a void: %v, want nil", err)
			}
			if _, held := holder(c, li, "r"); held {
				t.Fatal("the release reported done, the key still held")
			}
			waitFloor(t, c, b.Info().Session.ID, void.ID)
		})
	}
}
