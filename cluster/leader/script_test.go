package leader

// Data-driven scripts in the style of locksm's (testdata/*.txt): each case
// is one input to the core, and its expected output is everything the core
// produced for it, so a script reads as a trace of the leader.
//
//	# comments and blank lines before a case are kept on rewrite
//	acquire conn=c1 id=1 key=k owner=a lease=10 wait=0
//	----
//	propose acquire key=k owner=a lease=10 wait=0 ref=1
//
// The expected output runs from "----" to the next blank line. Values are
// bare words or Go-quoted strings.
//
// The runner plays everything around the core: the applied lock table (a
// locksm.State), the log (commands proposed and not yet applied or failed,
// in order), the armed timers, a clock (ms from the start), and what Raft
// knows of the leader. Commands:
//
//	config [server=] [addr=] [max-inflight=] [max-keys=] [max-waiters=]
//	       [max-conn-waiters=] [max-sessions=] [max-outcomes=] [positions=]
//	                             (positions: the PositionInterval in ms;
//	                             0, the default, sends none)
//	                             a fresh core, table, log and clock
//	leader id=                   the leader Raft knows ("" none)
//	address id= addr=            a client address the log records
//	open conn= [version=]        a connection's handshake done (version 3)
//	close conn=                  its reader stopped
//	gain [term=]                 Raft made us leader (prints the epoch);
//	                             a new term (the last one + 1) unless told
//	barrier [epoch=]             the node's barrier applied every entry of
//	                             earlier terms (BarrierApplied; Serve
//	                             implies it)
//	serve [epoch=] [skew=]       prepared: Serve (default the current
//	                             epoch; skew: ms the leader's wall clock
//	                             is ahead of the stamps' clock)
//	lose [why=]                  leadership lost
//	close-node                   Core.Close
//	acquire conn= id= key= owner= lease= [wait=] [label=]
//	acquire-block conn= id= keys=k1,k2,... owner= lease= [wait=] [label=]
//	cluster-version v=           the log's cluster version (default: newest)
//	release conn= id= key= owner= token=
//	extend conn= id= key= owner= token= lease=
//	cancel conn= id= target=
//	ack conn= id=                a notice acknowledgement
//	open-session conn= id= session= [timeout=] [secret=]
//	resume conn= id= session= [secret=] [high=] [ack=]
//	session-ack conn= id= serial=
//	close-session conn= id=
//	                             the session frames o, y, k, d (version 7;
//	                             timeout 10000 ms and secret "s<session>"
//	                             by default)
//	watch conn= id=              ask for places in line (w, version 12)
//	revoke conn= id= key= token= [by=] [reason=]
//	                             an operator's revoke (Core.Revoke; by
//	                             "ops" unless told)
//	frame conn= type= [id=]      any other frame type (one character)
//	append op= [key= owner= token= ref= lease= wait= session= seq= ack= epoch=
//	       secret= timeout= term=]
//	                             (term: the entry's Raft term, the latest
//	                             gain's unless told; a newer one than the
//	                             core's leadership means another leader)
//	                             a command the core did not propose (the
//	                             new leader's drop-waiters, say) joins the log
//	commit [n=]                  apply the first n logged commands (all)
//	fail [n=] appended=no|maybe [err=]
//	                             the first n logged proposals failed (all),
//	                             each reported with the epoch that proposed
//	                             it (Ready.Epoch), as the node's futures are
//	advance ms=                  the clock moves; due timers fire in order
//	due kind=expire|wait key= [token=] [ref=] [at=] epoch=
//	                             hand the core a due timer it may not have
//	                             armed (a stale one, say)
//	handover to= [addr=]         BeginHandOver
//	handover-stop                StopServing
//	handover-end [failed=]       EndHandOver
//	timers                       the armed timers, in firing order
//	state                        the lock table
//	core                         the core's own state
//
// After every case the runner checks the core's bookkeeping (see check).
//
// Run `go test ./cluster/leader -run TestScripts -rewrite` (or set
// LEADER_REWRITE=1) to regenerate the expected outputs; review the diff.

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
	"ticketing/locksm/scripttest"
)

var rewrite = flag.Bool("rewrite", false, "rewrite expected output of testdata scripts")

func TestScripts(t *testing.T) {
	for _, f := range scripttest.Files(t, "testdata") {
		t.Run(scripttest.Name(f), func(t *testing.T) {
			h := newHarness(Config{})
			scripttest.Run(t, f, *rewrite || os.Getenv("LEADER_REWRITE") != "", func(t *testing.T, c scripttest.Case) string {
				got, err := h.run(c.Cmd)
				if err != nil {
					t.Fatalf("%s: %s: %v", c.Where(), c.Cmd, err)
				}
				if err := h.k.check(); err != nil {
					t.Fatalf("%s: %s: core bookkeeping: %v", c.Where(), c.Cmd, err)
				}
				if strings.TrimRight(got, "\n") == "" {
					return "ok"
				}
				return got
			})
		})
	}
}

// ---- the world around the core ----

// stateTable is a Table over a locksm.State (no locking: one goroutine).
type stateTable struct {
	s       *locksm.State
	version *uint16 // the cluster version; nil: the newest
}

func (t stateTable) Occupancy(key string) (bool, int, int) {
	return t.s.Occupied(key), t.s.NumHeld() + t.s.NumReserved() + t.s.NumSemaphores() + t.s.NumPermitsHeld(), t.s.QueueLen(key)
}

func (t stateTable) ClusterVersion() uint16 {
	if t.version == nil {
		return wire.ProtocolVersion
	}
	return *t.version
}

func (t stateTable) HeldUnder(key string, token uint64) bool { return t.s.HeldUnder(key, token) }

func (t stateTable) SessionHolds(id, token uint64) bool { return t.s.SessionHolds(id, token) }

func (t stateTable) SessionRevokes(id uint64) []locksm.SessionRevoke { return t.s.SessionRevokes(id) }

func (t stateTable) Semaphore(key string) (locksm.Semaphore, bool) { return t.s.Semaphore(key) }

func (t stateTable) MatchesHolding(key, owner string, token, session uint64) bool {
	return t.s.MatchesHolding(key, owner, token, session)
}

func (t stateTable) RangeHolders(fn func(string, locksm.Holder) bool) { t.s.RangeHolders(fn) }

func (t stateTable) Sessions() []uint64                           { return t.s.Sessions() }
func (t stateTable) NumSessions() int                             { return t.s.NumSessions() }
func (t stateTable) Session(id uint64) (locksm.SessionInfo, bool) { return t.s.Session(id) }
func (t stateTable) SessionOutcomes(id uint64) []locksm.Outcome   { return t.s.SessionOutcomes(id) }
func (t stateTable) SessionWaiters(id uint64) []locksm.SessionQueued {
	return t.s.SessionWaiters(id)
}
func (t stateTable) RangeWaiters(key string, fn func(*locksm.Waiter) bool) { t.s.RangeWaiters(key, fn) }

// directory is what Raft and the log know of the leader.
type directory struct {
	leader string
	addrs  map[string]string
}

func (d *directory) Leader() string              { return d.leader }
func (d *directory) ClientAddr(id string) string { return d.addrs[id] }

// scriptBase is the clock's zero (wall time stamped into commands is
// scriptBase + the clock; the monotonic readings are the same values).
var scriptBase = time.UnixMilli(1_700_000_000_000)

type armed struct {
	t   Timer
	seq int // arming order: ties fire in it
}

type harness struct {
	cfg     Config
	k       *Core[string]
	st      *locksm.State
	version *uint16 // the cluster version the table reports
	dir     *directory
	log     []locksm.Command // proposed, not yet applied or failed
	logTerm []uint64         // the term of each entry of log
	// logEpoch: the core's leadership epoch that proposed each entry of
	// log (Ready.Epoch), handed back when it fails.
	logEpoch []uint64
	timers   []armed
	timerSeq int
	clock    time.Duration
	ho       *HandOver
	// term: the Raft term of the latest gain (each gain is a new term
	// unless told); appended and proposed commands are of it.
	term uint64
	// replies and proposals seen, for the randomized test's checks.
	onSend    func(Send[string])
	onApplied func(Applied)
	onPropose func(locksm.Command)
	onClose   func(string)
}

func defaultConfig(c Config) Config {
	if c.ServerID == "" {
		c.ServerID = "n1"
	}
	if c.Advertise == "" {
		c.Advertise = "n1:7000"
	}
	if c.MaxInFlightPerConn == 0 {
		c.MaxInFlightPerConn = 8
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = 100
	}
	if c.MaxWaitersPerKey == 0 {
		c.MaxWaitersPerKey = 8
	}
	if c.MaxWaitersPerConn == 0 {
		c.MaxWaitersPerConn = 16
	}
	return c
}

func newHarness(cfg Config) *harness {
	cfg = defaultConfig(cfg)
	v := uint16(wire.ProtocolVersion)
	h := &harness{cfg: cfg, st: locksm.New(), dir: &directory{addrs: map[string]string{}}, version: &v}
	h.k = New[string](cfg, stateTable{h.st, h.version}, h.dir)
	return h
}

func (h *harness) now() time.Time { return scriptBase.Add(h.clock) }

// drain performs the core's outputs: the log and the timers take theirs,
// and everything is printed.
func (h *harness) drain(b *strings.Builder) {
	rd := h.k.Ready()
	for _, s := range rd.Sends {
		fmt.Fprintf(b, "send %s %s\n", s.To, fmtMsg(s.Msg))
		if h.onSend != nil {
			h.onSend(s)
		}
	}
	for _, c := range rd.Proposals {
		fmt.Fprintf(b, "propose %s\n", fmtCmd(c))
		h.log = append(h.log, c)
		h.logTerm = append(h.logTerm, h.term)
		h.logEpoch = append(h.logEpoch, rd.Epoch)
		if h.onPropose != nil {
			h.onPropose(c)
		}
	}
	if rd.ClearTimers {
		if len(h.timers) > 0 {
			fmt.Fprintf(b, "clear-timers (%d)\n", len(h.timers))
		}
		h.timers = nil
	}
	for _, t := range rd.Timers {
		fmt.Fprintf(b, "arm %s\n", fmtTimer(t))
		h.timerSeq++
		h.timers = append(h.timers, armed{t, h.timerSeq})
	}
	for _, e := range rd.Events {
		fmt.Fprintf(b, "metric %s\n", fmtEvent(e))
	}
	for _, r := range rd.Refusals {
		fmt.Fprintf(b, "refused %s session=%d code=%s\n", r.Conn, r.Session, wire.CodeOf(r.Err))
	}
	for _, sl := range rd.Silences {
		fmt.Fprintf(b, "silence %s max=%v\n", sl.Conn, sl.Max)
	}
	for _, c := range rd.Closes {
		fmt.Fprintf(b, "close-conn %s\n", c)
		if h.onClose != nil {
			h.onClose(c)
		}
	}
	h.k.Advance()
}

func (h *harness) run(line string) (string, error) {
	name, args, err := scripttest.ParseCommand(line)
	if err != nil {
		return "", err
	}
	a := &argReader{args: args}
	var b strings.Builder
	switch name {
	case "config":
		cfg := Config{ServerID: a.str("server", ""), Advertise: a.str("addr", ""),
			MaxInFlightPerConn: a.int("max-inflight", 0), MaxKeys: a.int("max-keys", 0),
			MaxWaitersPerKey: a.int("max-waiters", 0), MaxWaitersPerConn: a.int("max-conn-waiters", 0),
			MaxSessions: a.int("max-sessions", 0), MaxSessionOutcomes: a.int("max-outcomes", 0),
			PositionInterval: time.Duration(a.int("positions", 0)) * time.Millisecond}
		if a.err != nil {
			return "", a.err
		}
		*h = *newHarness(cfg)
	case "leader":
		h.dir.leader = a.str("id", "")
	case "address":
		h.dir.addrs[a.need("id")] = a.need("addr")
	case "open":
		h.k.Open(a.need("conn"), uint16(a.int("version", wire.VersionNotices)))
	case "close":
		h.k.Closed(h.now(), a.need("conn"))
	case "gain":
		h.term = uint64(a.int("term", int(h.term)+1))
		fmt.Fprintf(&b, "epoch=%d\n", h.k.GainLeadership(h.term))
	case "barrier":
		_, epoch := h.k.Leading()
		fmt.Fprintf(&b, "own-term=%v\n", h.k.BarrierApplied(uint64(a.int("epoch", int(epoch)))))
	case "serve":
		_, epoch := h.k.Leading()
		skew := int64(a.int("skew", 0))
		n, ok := h.k.Serve(h.now(), h.now().UnixMilli()+skew, uint64(a.int("epoch", int(epoch))))
		if ok {
			fmt.Fprintf(&b, "serving=%v holders=%d\n", h.k.Serving(), n)
		} else {
			b.WriteString("stale epoch\n")
		}
	case "lose":
		was, owed := h.k.LoseLeadership(a.str("why", "leadership lost"))
		fmt.Fprintf(&b, "was-leading=%v owed=%d\n", was, owed)
	case "close-node":
		h.k.Close()
	case "cluster-version":
		*h.version = uint16(a.int("v", 0))
	case "acquire", "acquire-block", "release", "extend", "cancel", "ack", "frame", "open-session", "resume", "session-ack",
		"close-session", "acquire-permit", "set-permits", "watch":
		cn := a.need("conn")
		m := wire.Msg{ID: uint64(a.int("id", 0))}
		switch name {
		case "acquire":
			m.Type, m.Key, m.Owner = wire.TypeAcquire, a.str("key", ""), a.str("owner", "")
			m.Lease, m.WaitMs, m.Label = uint16(a.int("lease", 0)), uint32(a.int("wait", 0)), a.str("label", "")
		case "acquire-permit":
			m.Type, m.Key, m.Owner = wire.TypeAcquirePermit, a.str("key", ""), a.str("owner", "")
			m.Lease, m.WaitMs, m.Label = uint16(a.int("lease", 0)), uint32(a.int("wait", 0)), a.str("label", "")
		case "set-permits":
			m.Type, m.Key, m.Permits = wire.TypeSetPermits, a.str("key", ""), uint32(a.int("permits", 0))
		case "acquire-block":
			m.Type, m.Keys, m.Owner = wire.TypeAcquireBlock, strings.Split(a.need("keys"), ","), a.str("owner", "")
			m.Lease, m.WaitMs, m.Label = uint16(a.int("lease", 0)), uint32(a.int("wait", 0)), a.str("label", "")
		case "release":
			m.Type, m.Key, m.Owner, m.Token = wire.TypeRelease, a.str("key", ""), a.str("owner", ""), uint64(a.int("token", 0))
		case "extend":
			m.Type, m.Key, m.Owner, m.Token = wire.TypeExtend, a.str("key", ""), a.str("owner", ""), uint64(a.int("token", 0))
			m.Lease = uint16(a.int("lease", 0))
		case "cancel":
			m.Type, m.Target = wire.TypeCancel, uint64(a.int("target", 0))
		case "ack":
			m.Type = wire.TypeNoticeAck
		case "open-session", "resume":
			m.Session = uint64(a.int("session", 0))
			copy(m.Secret[:], a.str("secret", fmt.Sprintf("s%d", m.Session)))
			if name == "open-session" {
				m.Type, m.TimeoutMs = wire.TypeOpenSession, uint32(a.int("timeout", 10000))
			} else {
				m.Type, m.High, m.Serial = wire.TypeResume, uint64(a.int("high", 0)), uint64(a.int("ack", 0))
			}
		case "session-ack":
			m.Type, m.Serial = wire.TypeSessionAck, uint64(a.int("serial", 0))
		case "close-session":
			m.Type = wire.TypeCloseSession
		case "frame":
			m.Type = a.need("type")[0]
		case "watch":
			m.Type = wire.TypeWatchPositions
		}
		if a.err != nil {
			return "", a.err
		}
		if !h.k.Request(h.now(), cn, &m) {
			fmt.Fprintf(&b, "close %s\n", cn)
		}
	case "revoke":
		cn := a.need("conn")
		id, key, token := uint64(a.int("id", 0)), a.str("key", ""), uint64(a.int("token", 0))
		by, reason := a.str("by", "ops"), a.str("reason", "")
		if a.err != nil {
			return "", a.err
		}
		h.k.Revoke(h.now(), cn, id, key, token, by, reason)
	case "append":
		term := uint64(a.int("term", int(h.term)))
		c, err := parseCmd(a)
		if err != nil {
			return "", err
		}
		h.log = append(h.log, c)
		h.logTerm = append(h.logTerm, term)
		h.logEpoch = append(h.logEpoch, 0) // another node's: none of this core's epochs
	case "commit":
		n := a.int("n", len(h.log))
		if n > len(h.log) {
			return "", fmt.Errorf("only %d commands in the log", len(h.log))
		}
		batch := make([]Applied, 0, n)
		for i, c := range h.log[:n] {
			c.Now = h.now().UnixMilli()
			h.st.SetLegacyMatching(*h.version < wire.VersionStrictMatch) // as the FSM does
			h.st.SetExtendMayShorten(*h.version < wire.VersionExtendNeverShortens)
			res, eff := h.st.Apply(c, nil)
			fmt.Fprintf(&b, "applied %s: %s\n", fmtCmd(c), fmtResult(res, eff))
			batch = append(batch, Applied{Cmd: c, Res: res, Effects: eff, Term: h.logTerm[i]})
			if h.onApplied != nil {
				h.onApplied(batch[len(batch)-1])
			}
		}
		h.log, h.logTerm, h.logEpoch = h.log[n:], h.logTerm[n:], h.logEpoch[n:]
		h.k.Applied(h.now(), batch)
	case "fail":
		n := a.int("n", len(h.log))
		if n > len(h.log) {
			return "", fmt.Errorf("only %d commands in the log", len(h.log))
		}
		var notAppended bool
		switch ap := a.need("appended"); ap {
		case "no":
			notAppended = true
		case "maybe":
		default:
			return "", fmt.Errorf("appended=%s: want no or maybe", ap)
		}
		failed, epochs := slices.Clone(h.log[:n]), slices.Clone(h.logEpoch[:n])
		h.log, h.logTerm, h.logEpoch = h.log[n:], h.logTerm[n:], h.logEpoch[n:]
		// Each run of entries one epoch proposed fails as its batch,
		// reported with that epoch (as the node's futures are).
		for len(failed) > 0 {
			run := 1
			for run < len(failed) && epochs[run] == epochs[0] {
				run++
			}
			h.k.ProposalFailed(epochs[0], failed[:run], notAppended, errors.New(a.str("err", "leadership lost")))
			failed, epochs = failed[run:], epochs[run:]
		}
	case "advance":
		h.clock += time.Duration(a.int("ms", 0)) * time.Millisecond
		if a.err != nil {
			return "", a.err
		}
		for {
			i := h.nextDue()
			if i < 0 {
				break
			}
			t := h.timers[i].t
			h.timers = slices.Delete(h.timers, i, i+1)
			fmt.Fprintf(&b, "fire %s\n", fmtTimer(t))
			h.k.TimerDue(t)
			h.drain(&b)
		}
	case "due":
		t := Timer{Key: a.need("key"), Token: uint64(a.int("token", 0)), Ref: uint64(a.int("ref", 0)),
			At: scriptBase.Add(time.Duration(a.int("at", 0)) * time.Millisecond), Epoch: uint64(a.int("epoch", 0))}
		switch kind := a.need("kind"); kind {
		case "expire":
			t.Kind = TimerExpire
		case "wait":
			t.Kind = TimerWait
		default:
			return "", fmt.Errorf("kind=%s: want expire or wait", kind)
		}
		h.k.TimerDue(t)
	case "handover":
		ho, n, err := h.k.BeginHandOver(a.need("to"), a.str("addr", ""))
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", err)
		} else {
			h.ho = ho
			fmt.Fprintf(&b, "told=%d stopped=%v\n", n, h.k.HandOverStopped(ho))
		}
	case "handover-stop":
		if h.ho == nil {
			return "", errors.New("no hand-over")
		}
		if err := h.k.StopServing(h.ho); err != nil {
			fmt.Fprintf(&b, "error: %v\n", err)
		}
	case "handover-end":
		if h.ho == nil {
			return "", errors.New("no hand-over")
		}
		h.k.EndHandOver(h.now(), h.ho, a.str("failed", "false") == "true")
		fmt.Fprintf(&b, "serving=%v\n", h.k.Serving())
	case "timers":
		ts := slices.Clone(h.timers)
		slices.SortStableFunc(ts, func(x, y armed) int { return x.t.At.Compare(y.t.At) })
		for _, t := range ts {
			fmt.Fprintf(&b, "%s\n", fmtTimer(t.t))
		}
		if len(ts) == 0 {
			b.WriteString("none\n")
		}
	case "state":
		b.WriteString(formatState(h.st))
	case "core":
		b.WriteString(h.formatCore())
	default:
		return "", fmt.Errorf("unknown command %q", name)
	}
	if a.err != nil {
		return "", a.err
	}
	if err := a.unused(); err != nil {
		return "", err
	}
	h.drain(&b)
	return b.String(), nil
}

// nextDue is the index of the earliest due timer (ties: armed first), or -1.
func (h *harness) nextDue() int {
	best := -1
	for i, t := range h.timers {
		if t.t.At.After(h.now()) {
			continue
		}
		if best < 0 || t.t.At.Before(h.timers[best].t.At) || (t.t.At.Equal(h.timers[best].t.At) && t.seq < h.timers[best].seq) {
			best = i
		}
	}
	return best
}

// ---- formatting ----

func ms(t time.Time) int64 { return t.Sub(scriptBase).Milliseconds() }

func fmtMsg(m wire.Msg) string {
	switch m.Type {
	case wire.TypeGranted:
		if m.Permit {
			return fmt.Sprintf("G id=%d token=%d slot=%d", m.ID, m.Token, m.Slot)
		}
		return fmt.Sprintf("G id=%d token=%d", m.ID, m.Token)
	case wire.TypeMoved:
		return fmt.Sprintf("M id=%d leader=%q addr=%q", m.ID, m.LeaderID, m.LeaderAddr)
	case wire.TypeUnknown:
		return fmt.Sprintf("U id=%d %q", m.ID, m.Text)
	case wire.TypeError:
		return fmt.Sprintf("E id=%d code=%s %q", m.ID, m.Code, m.Text)
	case wire.TypeNotice:
		return fmt.Sprintf("N %s leader=%q addr=%q", m.Event, m.LeaderID, m.LeaderAddr)
	case wire.TypeLost:
		if m.Reason == wire.LostRevoked {
			return fmt.Sprintf("X %s key=%s token=%d by=%s why=%q", m.Reason, m.Key, m.Token, m.Owner, m.Text)
		}
		return fmt.Sprintf("X %s key=%s token=%d", m.Reason, m.Key, m.Token)
	case wire.TypeOK:
		if m.Token != 0 { // a revoke's (in-process): the revoked token, and whom its commit granted
			return fmt.Sprintf("K id=%d token=%d next=%d", m.ID, m.Token, m.High)
		}
	case wire.TypeOutcomes:
		return fmt.Sprintf("O session=%d serial=%d", m.Session, m.Serial)
	case wire.TypePosition:
		est := "-"
		if m.EstimateMs != wire.EstimateUnknown {
			est = strconv.FormatUint(uint64(m.EstimateMs), 10)
		}
		return fmt.Sprintf("R id=%d key=%s position=%d estimate=%s", m.ID, m.Key, m.Position, est)
	}
	return fmt.Sprintf("%c id=%d", m.Type, m.ID)
}

var opNames = map[locksm.Op]string{
	locksm.OpAcquire: "acquire", locksm.OpRelease: "release", locksm.OpExpire: "expire",
	locksm.OpCancelWait: "cancel", locksm.OpDropWaiters: "drop-waiters", locksm.OpAcquireBlock: "acquire-block",
	locksm.OpExtend: "extend", locksm.OpOpenSession: "open-session", locksm.OpResumeSession: "resume-session",
	locksm.OpExpireSession: "expire-session", locksm.OpCloseSession: "close-session", locksm.OpDropSessionless: "drop-sessionless",
	locksm.OpAckSession: "ack-session", locksm.OpAcquirePermit: "acquire-permit", locksm.OpSetPermits: "set-permits",
	locksm.OpRevoke: "revoke",
}

func fmtCmd(c locksm.Command) string {
	s := fmtCmd1(c)
	if c.Session != 0 && !c.Op.SessionOp() {
		s += fmt.Sprintf(" session=%d seq=%d ack=%d", c.Session, c.Seq, c.Ack)
	}
	return s
}

func fmtCmd1(c locksm.Command) string {
	switch c.Op {
	case locksm.OpOpenSession:
		return fmt.Sprintf("open-session session=%d timeout=%d hash=%x", c.Session, c.TimeoutMs, c.SecretHash[:min(4, len(c.SecretHash))])
	case locksm.OpResumeSession:
		return fmt.Sprintf("resume-session session=%d seq=%d ack=%d epoch=%d", c.Session, c.Seq, c.Ack, c.Epoch)
	case locksm.OpExpireSession:
		return fmt.Sprintf("expire-session session=%d epoch=%d tokens=%v", c.Session, c.Epoch, c.Tokens)
	case locksm.OpCloseSession:
		return fmt.Sprintf("close-session session=%d", c.Session)
	case locksm.OpDropSessionless:
		return "drop-sessionless"
	case locksm.OpAckSession:
		return fmt.Sprintf("ack-session session=%d ack=%d", c.Session, c.Ack)
	case locksm.OpAcquire:
		return fmt.Sprintf("acquire key=%s owner=%s lease=%d wait=%d ref=%d", c.Key, c.Owner, c.LeaseSec, c.WaitMs, c.Ref) + labelSuffix(c.Label)
	case locksm.OpAcquirePermit:
		return fmt.Sprintf("acquire-permit key=%s owner=%s lease=%d wait=%d ref=%d", c.Key, c.Owner, c.LeaseSec, c.WaitMs, c.Ref) + labelSuffix(c.Label)
	case locksm.OpSetPermits:
		return fmt.Sprintf("set-permits key=%s permits=%d", c.Key, c.Permits)
	case locksm.OpRevoke:
		return fmt.Sprintf("revoke key=%s token=%d by=%s ref=%d reason=%q", c.Key, c.Token, c.Owner, c.Ref, c.Reason)
	case locksm.OpRelease:
		return fmt.Sprintf("release key=%s owner=%s token=%d ref=%d", c.Key, c.Owner, c.Token, c.Ref)
	case locksm.OpExpire:
		return fmt.Sprintf("expire key=%s token=%d", c.Key, c.Token)
	case locksm.OpCancelWait:
		return fmt.Sprintf("cancel key=%s ref=%d", c.Key, c.Ref)
	case locksm.OpExtend:
		return fmt.Sprintf("extend key=%s owner=%s token=%d lease=%d ref=%d", c.Key, c.Owner, c.Token, c.LeaseSec, c.Ref)
	case locksm.OpDropWaiters:
		return "drop-waiters"
	case locksm.OpAcquireBlock:
		return fmt.Sprintf("acquire-block keys=%s owner=%s lease=%d wait=%d ref=%d", strings.Join(c.Keys, ","), c.Owner, c.LeaseSec, c.WaitMs, c.Ref) +
			labelSuffix(c.Label)
	}
	return fmt.Sprintf("op=%d", c.Op)
}

// labelSuffix shows an acquire's label, if any (scripts without labels
// read as before).
func labelSuffix(l string) string {
	if l == "" {
		return ""
	}
	return " label=" + l
}

func parseCmd(a *argReader) (locksm.Command, error) {
	c := locksm.Command{Key: a.str("key", ""), Owner: a.str("owner", ""), Token: uint64(a.int("token", 0)),
		Keys: strings.Split(a.str("keys", ""), ","),
		Ref:  uint64(a.int("ref", 0)), LeaseSec: uint32(a.int("lease", 0)), WaitMs: uint32(a.int("wait", 0)),
		Session: uint64(a.int("session", 0)), Seq: uint64(a.int("seq", 0)), Ack: uint64(a.int("ack", 0)), Epoch: uint64(a.int("epoch", 0))}
	op := a.need("op")
	for o, name := range opNames {
		if name == op {
			c.Op = o
		}
	}
	if c.Op == 0 {
		return c, fmt.Errorf("unknown op %q", op)
	}
	if c.Op != locksm.OpAcquireBlock {
		c.Keys = nil
	}
	if c.Op == locksm.OpRevoke {
		c.Reason = a.str("reason", "")
	}
	if c.Op == locksm.OpOpenSession {
		// As a broker's open: the secret's hash (secret "s<session>"
		// by default, as open-session sends it) and its timeout.
		var secret [16]byte
		copy(secret[:], a.str("secret", fmt.Sprintf("s%d", c.Session)))
		hash := sha256.Sum256(secret[:])
		c.SecretHash, c.TimeoutMs = string(hash[:]), uint32(a.int("timeout", 10000))
	}
	return c, a.err
}

var statusNames = map[locksm.Status]string{
	locksm.StatusRejected: "rejected", locksm.StatusGranted: "granted", locksm.StatusQueued: "queued",
	locksm.StatusBusy: "busy", locksm.StatusReleased: "released", locksm.StatusExpired: "expired",
	locksm.StatusCanceled: "canceled", locksm.StatusNoop: "noop", locksm.StatusDropped: "dropped",
	locksm.StatusExtended: "extended", locksm.StatusTimedOut: "timed-out", locksm.StatusOpened: "opened",
	locksm.StatusResumed: "resumed", locksm.StatusSessionExpired: "session-expired", locksm.StatusSessionClosed: "session-closed",
	locksm.StatusAcked: "acked", locksm.StatusPermitsSet: "permits-set", locksm.StatusRevoked: "revoked",
}

var effectNames = map[locksm.EffectKind]string{
	locksm.EffectGranted: "granted", locksm.EffectTimedOut: "timed-out", locksm.EffectDropped: "dropped",
	locksm.EffectRevoked: "revoked",
}

func fmtResult(res locksm.Result, effects []locksm.Effect) string {
	var b strings.Builder
	b.WriteString(statusNames[res.Status])
	if res.Status == locksm.StatusGranted {
		fmt.Fprintf(&b, " token=%d", res.Token)
		if res.Slot != 0 {
			fmt.Fprintf(&b, " slot=%d", res.Slot)
		}
	}
	if res.Status == locksm.StatusExtended {
		fmt.Fprintf(&b, " lease=%d", res.LeaseSec)
	}
	if res.Status == locksm.StatusRevoked {
		fmt.Fprintf(&b, " token=%d", res.Token)
	}
	if res.Err != nil {
		fmt.Fprintf(&b, " err=%q", res.Err)
	}
	if res.Serial != 0 {
		fmt.Fprintf(&b, " serial=%d", res.Serial)
	}
	for _, e := range effects {
		fmt.Fprintf(&b, ", %s key=%s ref=%d", effectNames[e.Kind], e.Key, e.Ref)
		if e.Kind == locksm.EffectGranted || e.Kind == locksm.EffectRevoked {
			fmt.Fprintf(&b, " token=%d", e.Token)
			if e.Slot != 0 {
				fmt.Fprintf(&b, " slot=%d", e.Slot)
			}
		}
		if e.Serial != 0 {
			fmt.Fprintf(&b, " serial=%d", e.Serial)
		}
	}
	return b.String()
}

func fmtTimer(t Timer) string {
	switch t.Kind {
	case TimerExpire:
		return fmt.Sprintf("expire key=%s token=%d at=%d epoch=%d", t.Key, t.Token, ms(t.At), t.Epoch)
	case TimerWait:
		return fmt.Sprintf("wait key=%s ref=%d at=%d epoch=%d", t.Key, t.Ref, ms(t.At), t.Epoch)
	case TimerSession:
		return fmt.Sprintf("session %d gen=%d at=%d epoch=%d", t.Session, t.Gen, ms(t.At), t.Epoch)
	case TimerPositions:
		return fmt.Sprintf("positions at=%d epoch=%d", ms(t.At), t.Epoch)
	}
	return fmt.Sprintf("kind=%d", t.Kind)
}

func fmtEvent(e Event) string {
	switch e.Kind {
	case EventReply:
		s := fmt.Sprintf("reply %s %s", opNames[e.Op], e.Outcome)
		if e.Op == 0 {
			s = fmt.Sprintf("reply - %s", e.Outcome)
		}
		if e.Outcome == OutcomeGranted {
			s += fmt.Sprintf(" queued=%v latency=%v", e.Queued, e.Latency)
			if e.Keys > 0 {
				s += fmt.Sprintf(" keys=%d", e.Keys)
			}
		}
		return s
	case EventHandoffLatency:
		return fmt.Sprintf("handoff-latency %v", e.Latency)
	case EventExpiry:
		return "expiry"
	case EventHandoff:
		return "handoff"
	case EventAbandonedGrant:
		return "abandoned-grant"
	case EventRefusedInFlight:
		return "refused in-flight"
	case EventRefusedKeys:
		return "refused keys"
	case EventRefusedWaiters:
		return "refused waiters-per-key"
	case EventRefusedConnWaiters:
		return "refused waiters-per-conn"
	case EventLostSent:
		return fmt.Sprintf("lost-sent conns=%d", e.Keys)
	case EventSessionOpened:
		return "session-opened"
	case EventSessionResumed:
		return fmt.Sprintf("session-resumed answers=%d", e.Keys)
	case EventSessionExpired:
		return fmt.Sprintf("session-expired released=%d", e.Keys)
	case EventSessionRefused:
		return "session-refused"
	case EventRefusedSessions:
		return "refused sessions"
	case EventRefusedOutcomes:
		return "refused session-outcomes"
	case EventSuperseded:
		return fmt.Sprintf("superseded owed=%d", e.Keys)
	case EventPositionsSent:
		return fmt.Sprintf("positions-sent n=%d", e.Keys)
	case EventRevoked:
		return fmt.Sprintf("revoked key=%s token=%d holder=%s by=%s reason=%q leading=%v", e.Revoke.Key, e.Revoke.Token, e.Revoke.Owner, e.Revoke.Who, e.Revoke.Reason, e.Leading)
	case EventUnexpectedResult:
		return fmt.Sprintf("unexpected-result op=%s status=%s", opNames[e.Op], statusNames[e.Status])
	}
	return fmt.Sprintf("kind=%d", e.Kind)
}

func formatState(s *locksm.State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "last-token=%d held=%d waiting=%d\n", s.LastToken(), s.NumHeld(), s.NumWaiting())
	seen := map[string]bool{}
	s.RangeHolders(func(k string, h locksm.Holder) bool {
		if h.Permit {
			fmt.Fprintf(&b, "%s: permit slot=%d owner=%s token=%d lease=%d", k, h.Slot, h.Owner, h.Token, h.LeaseSec)
		} else {
			fmt.Fprintf(&b, "%s: holder owner=%s token=%d lease=%d", k, h.Owner, h.Token, h.LeaseSec)
		}
		if h.Keys != nil {
			fmt.Fprintf(&b, " block=%s", strings.Join(h.Keys, ","))
		}
		b.WriteString(labelSuffix(h.Label) + "\n")
		if seen[k] {
			return true // a semaphore's waiters, listed after its first permit
		}
		seen[k] = true
		for _, w := range s.Waiters(k) {
			fmt.Fprintf(&b, "  waiter owner=%s ref=%d wait=%d", w.Owner, w.Ref, w.WaitMs)
			if w.Session != 0 {
				fmt.Fprintf(&b, " session=%d seq=%d", w.Session, w.Seq)
			}
			b.WriteString(labelSuffix(s.WaiterLabel(k, w)) + "\n")
		}
		return true
	})
	for _, id := range s.Sessions() {
		si, _ := s.Session(id)
		fmt.Fprintf(&b, "session %d floor=%d serial=%d ack=%d epoch=%d waiters=%d holdings=%d\n",
			id, si.Floor, si.Serial, si.Ack, si.Epoch, si.Waiters, si.Holdings)
		for _, o := range s.SessionOutcomes(id) {
			fmt.Fprintf(&b, "  outcome seq=%d serial=%d %s\n", o.Seq, o.Serial, fmtMsg(outcomeMsg(o)))
		}
	}
	return b.String()
}

func (h *harness) formatCore() string {
	k := h.k
	var b strings.Builder
	fmt.Fprintf(&b, "leading=%v ready=%v serving=%v epoch=%d owed=%d uncommitted=%d expiring=%d",
		k.leading, k.ready, k.serving, k.epoch, k.Owed(), k.uncommittedTotal, len(k.expiring))
	if k.sessQueued > 0 {
		fmt.Fprintf(&b, " session-waiters=%d", k.sessQueued)
	}
	if ho := k.handover; ho != nil {
		fmt.Fprintf(&b, " handover=%s active=%v stopped=%v unacked=%d", ho.id, ho.active, ho.stopped, ho.unacked)
	}
	b.WriteString("\n")
	for _, cn := range k.sortedConns() {
		if cn.acquiring+cn.releasing+cn.waiters > 0 {
			fmt.Fprintf(&b, "conn %s acquiring=%d releasing=%d waiters=%d\n", cn.handle, cn.acquiring, cn.releasing, cn.waiters)
		}
	}
	for _, id := range sortedSessionIDs(k.sessions) {
		s := k.sessions[id]
		fmt.Fprintf(&b, "session %d", id)
		if s.conn != nil {
			fmt.Fprintf(&b, " conn=%s", s.conn.handle)
		}
		fmt.Fprintf(&b, " ack=%d floor=%d gen=%d", s.ack, s.floor, s.gen)
		if s.expiring {
			b.WriteString(" expiring")
		}
		if p := k.attachingTo[id]; p != nil {
			fmt.Fprintf(&b, " attaching=%s", p.conn.handle)
		}
		if len(s.waiting) > 0 {
			fmt.Fprintf(&b, " waiting=%d", len(s.waiting))
		}
		b.WriteString("\n")
	}
	if len(k.untold) > 0 {
		fmt.Fprintf(&b, "untold %v\n", slices.Sorted(maps.Keys(k.untold)))
	}
	for _, p := range sortedByRef(k.pend) {
		handle := fmt.Sprint(p.conn.handle)
		if handle == "" {
			handle = "-"
		}
		fmt.Fprintf(&b, "owed ref=%d %s id=%d %s key=%s", p.ref, handle, p.id, opNames[p.op], p.key)
		if p.session() != nil {
			fmt.Fprintf(&b, " session=%d", p.session().id)
		}
		if p.queued {
			b.WriteString(" queued")
		}
		if p.cancel {
			b.WriteString(" cancel")
		}
		if p.uncommitted {
			b.WriteString(" uncommitted")
		}
		if p.conn.dead {
			b.WriteString(" dead-conn")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// check verifies the core's bookkeeping: the pending table, the
// connections' in-flight maps and the uncommitted counts agree, and owed
// replies exist only while leading.
func (k *Core[C]) check() error {
	total, perKey := 0, map[string]int{}
	for ref, p := range k.pend {
		if p.ref != ref {
			return fmt.Errorf("pending ref %d filed under %d", p.ref, ref)
		}
		if p.conn.inflight[p.id] != p {
			return fmt.Errorf("pending ref %d missing from its connection's in-flight map", ref)
		}
		if p.queued && p.conn.dead && !p.cancel && p.session() == nil {
			return fmt.Errorf("ref %d queued for a dead connection, not cancelled", ref)
		}
		if p.uncommitted {
			if p.queued {
				return fmt.Errorf("ref %d queued and uncommitted", ref)
			}
			for _, key := range p.keySet() {
				total++
				if p.mayWait {
					perKey[key]++
				}
			}
		}
	}
	for ref := range k.blockTold {
		if p := k.pend[ref]; p == nil || p.keys == nil {
			return fmt.Errorf("places told kept for ref %d, which is no block owed here", ref)
		}
	}
	if !k.leading && (len(k.posDirty) > 0 || k.posArmed != 0) {
		return fmt.Errorf("not leading, with %d lines marked (walk armed in epoch %d)", len(k.posDirty), k.posArmed)
	}
	for ref, g := range k.raising {
		if p := k.pend[ref]; p == nil || p.op != locksm.OpSetPermits || g <= 0 {
			return fmt.Errorf("%d grants of a raise counted for ref %d, which is no set-permits owed here", g, ref)
		}
		total += g
	}
	if total != k.uncommittedTotal {
		return fmt.Errorf("uncommitted total %d, counted %d", k.uncommittedTotal, total)
	}
	if len(perKey) != len(k.uncommitted) {
		return fmt.Errorf("uncommitted per key %v, counted %v", k.uncommitted, perKey)
	}
	for key, n := range perKey {
		if k.uncommitted[key] != n {
			return fmt.Errorf("uncommitted per key %v, counted %v", k.uncommitted, perKey)
		}
	}
	for h, cn := range k.conns {
		if cn.handle != h || cn.dead {
			return fmt.Errorf("connection %v filed wrongly or dead", h)
		}
		for id, p := range cn.inflight {
			if p.id != id || k.pend[p.ref] != p {
				return fmt.Errorf("connection %v: in-flight id %d not pending", h, id)
			}
		}
	}
	if !k.leading && len(k.pend) > 0 {
		return fmt.Errorf("%d replies owed while not leading", len(k.pend))
	}
	// Extends in flight, by token, are the owed extends that could
	// succeed when they arrived (token 0: one that could not); a deferred
	// lease timer waits only on a token with one in flight.
	extends := map[uint64]int{}
	for _, p := range k.pend {
		if p.op == locksm.OpExtend && p.token != 0 {
			extends[p.token]++
		}
	}
	if !maps.Equal(extends, k.extending) {
		return fmt.Errorf("extends in flight %v, counted %v", k.extending, extends)
	}
	for token := range k.deferred {
		if extends[token] == 0 {
			return fmt.Errorf("lease timer of token %d deferred with no extend in flight", token)
		}
	}
	// Per connection: the counts agree with the owed requests, and stay
	// within their limits (open and dead connections alike).
	conns := map[*conn[C]]bool{}
	for _, cn := range k.conns {
		conns[cn] = true
	}
	for _, p := range k.pend {
		conns[p.conn] = true
	}
	for cn := range conns {
		var acq, rel, wait int
		for _, p := range cn.inflight {
			if !p.queued && p.acquire() {
				acq++
			}
			if !p.queued && releasing(p.op) {
				rel++
			}
			if p.acquire() && p.mayWait {
				wait++
			}
		}
		if acq != cn.acquiring || rel != cn.releasing || wait != cn.waiters {
			return fmt.Errorf("connection %v: counts acquiring %d releasing %d waiters %d, counted %d %d %d",
				cn.handle, cn.acquiring, cn.releasing, cn.waiters, acq, rel, wait)
		}
		if acq > k.cfg.MaxInFlightPerConn || rel > k.cfg.MaxInFlightPerConn || wait > k.cfg.MaxWaitersPerConn {
			return fmt.Errorf("connection %v over its limits: acquiring %d releasing %d (max %d each), waiters %d (max %d)",
				cn.handle, acq, rel, k.cfg.MaxInFlightPerConn, wait, k.cfg.MaxWaitersPerConn)
		}
	}
	if k.serving && (!k.leading || !k.ready) {
		return errors.New("serving but not leading and ready")
	}
	return k.checkSessions()
}

// checkSessions verifies the session bookkeeping: attachments agree both
// ways, a session's owed requests all sit on its home connection, the
// queued ones are counted, and an attach in flight is owed on a
// connection marked attaching.
func (k *Core[C]) checkSessions() error {
	queued := 0
	for _, p := range k.pend {
		if p.session() == nil {
			continue
		}
		if p.queued {
			queued++
		}
		if k.sessions[p.session().id] == p.session() && p.conn != p.session().home {
			return fmt.Errorf("ref %d of session %d owed on a connection that is not its home", p.ref, p.session().id)
		}
		if a := p.session().conn; a != nil && p.conn != a {
			return fmt.Errorf("ref %d of session %d not on its attached connection", p.ref, p.session().id)
		}
	}
	if queued != k.sessQueued {
		return fmt.Errorf("session waiters counted %d, owed %d", k.sessQueued, queued)
	}
	if !k.leading && (len(k.sessions) > 0 || len(k.attachingTo) > 0 || len(k.untold) > 0) {
		return errors.New("session state kept while not leading")
	}
	for id, s := range k.sessions {
		if s.id != id {
			return fmt.Errorf("session %d filed under %d", s.id, id)
		}
		if s.conn != nil && (s.conn.sess != s || s.conn.dead) {
			return fmt.Errorf("session %d attached to a connection that does not name it, or dead", id)
		}
	}
	for h, cn := range k.conns {
		if s := cn.sess; s != nil && (k.sessions[s.id] != s || s.conn != cn) {
			return fmt.Errorf("connection %v names session %d, which is not attached to it", h, s.id)
		}
	}
	for id, p := range k.attachingTo {
		if p.attachment() == nil || p.attachment().sid != id || k.pend[p.ref] != p || !p.conn.attaching {
			return fmt.Errorf("attach of session %d in flight without its owed request", id)
		}
	}
	return nil
}

// ---- command lines ----

type argReader struct {
	args map[string]string
	used map[string]bool
	err  error
}

func (a *argReader) get(k string) (string, bool) {
	if a.used == nil {
		a.used = map[string]bool{}
	}
	a.used[k] = true
	v, ok := a.args[k]
	return v, ok
}

func (a *argReader) str(k, def string) string {
	if v, ok := a.get(k); ok {
		return v
	}
	return def
}

func (a *argReader) need(k string) string {
	v, ok := a.get(k)
	if !ok && a.err == nil {
		a.err = fmt.Errorf("missing %s=", k)
	}
	return v
}

func (a *argReader) int(k string, def int) int {
	v, ok := a.get(k)
	if !ok {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 63)
	if err != nil && a.err == nil {
		a.err = fmt.Errorf("%s: %v", k, err)
	}
	return int(n)
}

func (a *argReader) unused() error {
	for k := range a.args {
		if !a.used[k] {
			return fmt.Errorf("unknown argument %s=", k)
		}
	}
	return nil
}
