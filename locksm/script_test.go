package locksm

// The state machine's data-driven scripts (runner: locksm/scripttest).
//
// A script in testdata/*.txt is a sequence of cases:
//
//	# comments and blank lines before a case are kept on rewrite
//	acquire key=k owner=a lease=10 wait=0 ref=1 now=1000
//	----
//	granted token=1
//
// The expected output runs from the "----" line to the next blank line (or
// the end of the file), so outputs never contain blank lines. Values are bare
// words, or Go-quoted strings optionally repeated: key="x"*256.
//
// Commands:
//
//	acquire key= owner= lease= wait= ref= now=
//	acquire-block keys=k1,k2,... owner= lease= wait= ref= now=
//	release key= owner= token= now=
//	expire  key= token= now=
//	extend  key= owner= token= lease= now=
//	cancel  key= ref=
//	drop-waiters
//	open-session    session= hash= timeout= now=
//	resume-session  session= seq= ack= epoch=
//	expire-session  session= epoch= tokens=t1,t2,... now=
//	close-session   session= now=
//	drop-sessionless
//	revoke  key= owner= token= reason= now= [ref=]
//	apply   op= [any field]      a raw Command, for unknown ops
//	legacy-matching on|off       State.SetLegacyMatching
//	extend-may-shorten on|off    State.SetExtendMayShorten
//	short-waits on|off           State.SetShortWaits
//	state                        holders and queues, keys ascending, then sessions
//
// acquire, acquire-block, release and extend also take session= seq= ack=
// (a lock command of a session). A result shows serial= when it recorded
// an outcome, an effect session= seq= serial= when its waiter has a
// session, a holder or waiter session= seq= when it has one.
//
// A holder shows renewed= (its RenewedAt) when it is not 0, and the
// state's first line renewed= (NumRenewed) while any holding is, and
// sessions= (NumSessions) while any session lives; each session is then
// listed with its counters, its kept outcomes and its queued requests.
// The revoke records kept come last, oldest first (revokes= on the first
// line while any is kept).
//
// After every command the runner checks the invariants and that a snapshot
// round trip and a codec round trip reproduce the state and the command.
//
// Run `go test ./locksm -run TestScripts -rewrite` (or set
// LOCKSM_REWRITE=1) to regenerate the expected outputs; review the diff.

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"ticketing/locksm/scripttest"
)

var rewrite = flag.Bool("rewrite", false, "rewrite expected output of testdata scripts")

func TestScripts(t *testing.T) {
	for _, f := range scripttest.Files(t, "testdata") {
		t.Run(scripttest.Name(f), func(t *testing.T) {
			s := New()
			scripttest.Run(t, f, *rewrite || os.Getenv("LOCKSM_REWRITE") != "", func(t *testing.T, c scripttest.Case) string {
				return runScriptCommand(t, c, s)
			})
		})
	}
}

func runScriptCommand(t *testing.T, c scripttest.Case, s *State) string {
	t.Helper()
	where := c.Where()
	if name, arg, ok := strings.Cut(c.Cmd, " "); ok && name == "legacy-matching" {
		// legacy-matching on|off: State.SetLegacyMatching (the cluster's
		// switch while some member is older than protocol version 9).
		on, ok := map[string]bool{"on": true, "off": false}[strings.TrimSpace(arg)]
		if !ok {
			t.Fatalf("%s: want legacy-matching on|off", where)
		}
		s.SetLegacyMatching(on)
		return "ok"
	}
	if name, arg, ok := strings.Cut(c.Cmd, " "); ok && name == "short-waits" {
		// short-waits on|off: State.SetShortWaits (the cluster's switch
		// while some member is older than version 11).
		on, ok := map[string]bool{"on": true, "off": false}[strings.TrimSpace(arg)]
		if !ok {
			t.Fatalf("%s: want short-waits on|off", where)
		}
		s.SetShortWaits(on)
		return "ok"
	}
	if name, arg, ok := strings.Cut(c.Cmd, " "); ok && name == "extend-may-shorten" {
		// extend-may-shorten on|off: State.SetExtendMayShorten (the
		// cluster's switch while some member is older than version 10).
		on, ok := map[string]bool{"on": true, "off": false}[strings.TrimSpace(arg)]
		if !ok {
			t.Fatalf("%s: want extend-may-shorten on|off", where)
		}
		s.SetExtendMayShorten(on)
		return "ok"
	}
	name, args, err := scripttest.ParseCommand(c.Cmd)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if name == "state" {
		return formatState(s)
	}
	cmd := Command{}
	switch name {
	case "acquire":
		cmd.Op = OpAcquire
	case "acquire-block":
		cmd.Op = OpAcquireBlock
	case "release":
		cmd.Op = OpRelease
	case "expire":
		cmd.Op = OpExpire
	case "extend":
		cmd.Op = OpExtend
	case "cancel":
		cmd.Op = OpCancelWait
	case "drop-waiters":
		cmd.Op = OpDropWaiters
	case "open-session":
		cmd.Op = OpOpenSession
	case "resume-session":
		cmd.Op = OpResumeSession
	case "expire-session":
		cmd.Op = OpExpireSession
	case "close-session":
		cmd.Op = OpCloseSession
	case "drop-sessionless":
		cmd.Op = OpDropSessionless
	case "ack-session":
		cmd.Op = OpAckSession
	case "acquire-permit":
		cmd.Op = OpAcquirePermit
	case "set-permits":
		cmd.Op = OpSetPermits
	case "revoke":
		cmd.Op = OpRevoke
	case "apply":
	default:
		t.Fatalf("%s: unknown command %q", where, name)
	}
	for k, v := range args {
		var err error
		switch k {
		case "key":
			cmd.Key = v
		case "keys":
			cmd.Keys = strings.Split(v, ",")
		case "owner":
			cmd.Owner = v
		case "label":
			cmd.Label = v
		case "reason":
			cmd.Reason = v
		case "op":
			var n uint64
			n, err = strconv.ParseUint(v, 10, 8)
			cmd.Op = Op(n)
		case "now":
			cmd.Now, err = strconv.ParseInt(v, 10, 64)
		case "token":
			cmd.Token, err = strconv.ParseUint(v, 10, 64)
		case "ref":
			cmd.Ref, err = strconv.ParseUint(v, 10, 64)
		case "lease":
			var n uint64
			n, err = strconv.ParseUint(v, 10, 32)
			cmd.LeaseSec = uint32(n)
		case "wait":
			var n uint64
			n, err = strconv.ParseUint(v, 10, 32)
			cmd.WaitMs = uint32(n)
		case "session":
			cmd.Session, err = strconv.ParseUint(v, 10, 64)
		case "seq":
			cmd.Seq, err = strconv.ParseUint(v, 10, 64)
		case "ack":
			cmd.Ack, err = strconv.ParseUint(v, 10, 64)
		case "epoch":
			cmd.Epoch, err = strconv.ParseUint(v, 10, 64)
		case "timeout":
			var n uint64
			n, err = strconv.ParseUint(v, 10, 32)
			cmd.TimeoutMs = uint32(n)
		case "hash":
			cmd.SecretHash = v
		case "permits":
			var n uint64
			n, err = strconv.ParseUint(v, 10, 32)
			cmd.Permits = uint32(n)
		case "tokens":
			for _, t := range strings.Split(v, ",") {
				n, perr := strconv.ParseUint(t, 10, 64)
				if perr != nil {
					err = perr
				}
				cmd.Tokens = append(cmd.Tokens, n)
			}
		default:
			t.Fatalf("%s: unknown argument %q", where, k)
		}
		if err != nil {
			t.Fatalf("%s: %s: %v", where, k, err)
		}
	}

	// Every command also travels through the codec and must mean the same
	// thing afterwards; only unknown ops cannot be encoded.
	if cmd.Op >= OpAcquire && cmd.Op <= maxOp {
		dec, err := DecodeBatch(AppendBatch(nil, []Command{cmd}), nil)
		if err != nil || len(dec) != 1 || !reflect.DeepEqual(dec[0], normalize(cmd)) {
			t.Fatalf("%s: codec round trip: %v %+v", where, err, dec)
		}
	}
	before, beforeTable := snapshotBytes(t, s), formatTable(s)
	res, effects := s.Apply(cmd, nil)
	switch {
	case res.Status != StatusRejected:
	case res.Serial == 0 && !bytes.Equal(before, snapshotBytes(t, s)):
		t.Errorf("%s: rejected command changed the state", where)
	case res.Serial != 0 && (beforeTable != formatTable(s) || len(effects) > 0):
		// Recorded as its session's outcome, and nothing else.
		t.Errorf("%s: rejected command changed the table", where)
	}
	if err := checkInvariants(s); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	checkSnapshotRoundTrip(t, s)
	return formatPermitResult(res, effects, cmd.Op == OpAcquirePermit, s.isSemaphore)
}

var statusNames = map[Status]string{
	StatusRejected: "rejected", StatusGranted: "granted", StatusQueued: "queued",
	StatusBusy: "busy", StatusReleased: "released", StatusExpired: "expired",
	StatusCanceled: "canceled", StatusNoop: "noop", StatusDropped: "dropped",
	StatusExtended: "extended", StatusTimedOut: "timed-out", StatusOpened: "opened",
	StatusResumed: "resumed", StatusSessionExpired: "session-expired", StatusSessionClosed: "session-closed",
	StatusAcked:      "acked",
	StatusPermitsSet: "permits-set",
	StatusRevoked:    "revoked",
}

var errNames = map[error]string{
	ErrInvalidKey: "ErrInvalidKey", ErrInvalidOwner: "ErrInvalidOwner", ErrInvalidLabel: "ErrInvalidLabel",
	ErrInvalidLease: "ErrInvalidLease", ErrInvalidWait: "ErrInvalidWait",
	ErrInvalidCommand: "ErrInvalidCommand", ErrNotHeld: "ErrNotHeld",
	ErrTokenMismatch: "ErrTokenMismatch", ErrOwnerMismatch: "ErrOwnerMismatch",
	ErrDuplicateRef: "ErrDuplicateRef", ErrTokensExhausted: "ErrTokensExhausted",
	ErrInvalidBlock: "ErrInvalidBlock", ErrInvalidSession: "ErrInvalidSession",
	ErrNoSession: "ErrNoSession", ErrSessionExists: "ErrSessionExists", ErrVoided: "ErrVoided",
	ErrDuplicateSeq: "ErrDuplicateSeq", ErrStaleEpoch: "ErrStaleEpoch",
	ErrIsSemaphore: "ErrIsSemaphore", ErrNotSemaphore: "ErrNotSemaphore",
	ErrInvalidPermits: "ErrInvalidPermits", ErrInUse: "ErrInUse", ErrInvalidReason: "ErrInvalidReason",
}

var effectNames = map[EffectKind]string{
	EffectGranted: "granted", EffectTimedOut: "timed-out", EffectDropped: "dropped", EffectRevoked: "revoked",
}

func formatResult(res Result, effects []Effect) string {
	return formatPermitResult(res, effects, false, func(string) bool { return false })
}

// formatPermitResult is formatResult that shows the slot of a permit's
// grant: of res if permit, of an effect if sem says its key is a
// semaphore.
func formatPermitResult(res Result, effects []Effect, permit bool, sem func(key string) bool) string {
	var b strings.Builder
	b.WriteString(statusNames[res.Status])
	if res.Status == StatusGranted {
		fmt.Fprintf(&b, " token=%d", res.Token)
		if permit {
			fmt.Fprintf(&b, " slot=%d", res.Slot)
		}
	}
	if res.Status == StatusRevoked {
		fmt.Fprintf(&b, " token=%d", res.Token)
		if res.Slot != 0 || len(effects) > 0 && sem(effects[0].Key) {
			fmt.Fprintf(&b, " slot=%d", res.Slot)
		}
	}
	if res.Status == StatusExtended {
		fmt.Fprintf(&b, " lease=%d", res.LeaseSec)
	}
	if res.Err != nil {
		name, ok := errNames[res.Err]
		if !ok {
			name = fmt.Sprintf("%q (not a sentinel)", res.Err)
		}
		fmt.Fprintf(&b, " err=%s", name)
	}
	if res.Serial != 0 {
		fmt.Fprintf(&b, " serial=%d", res.Serial)
	}
	for _, e := range effects {
		fmt.Fprintf(&b, "\neffect %s key=%s", effectNames[e.Kind], e.Key)
		if e.Keys != nil {
			fmt.Fprintf(&b, " keys=%s", strings.Join(e.Keys, ","))
		}
		fmt.Fprintf(&b, " owner=%s ref=%d", e.Owner, e.Ref)
		if e.Kind == EffectGranted {
			fmt.Fprintf(&b, " token=%d lease=%d", e.Token, e.LeaseSec)
			if sem(e.Key) {
				fmt.Fprintf(&b, " slot=%d", e.Slot)
			}
		}
		if e.Kind == EffectRevoked {
			fmt.Fprintf(&b, " token=%d", e.Token)
			if sem(e.Key) {
				fmt.Fprintf(&b, " slot=%d", e.Slot)
			}
		}
		if e.Session != 0 || e.Seq != 0 || e.Serial != 0 {
			fmt.Fprintf(&b, " session=%d seq=%d serial=%d", e.Session, e.Seq, e.Serial)
		}
	}
	return b.String()
}

// formatOutcome is an outcome as the scripts show it.
func formatOutcome(o Outcome) string {
	s := fmt.Sprintf("outcome seq=%d serial=%d %s", o.Seq, o.Serial, statusNames[o.Status])
	switch {
	case o.Status == StatusGranted:
		s += fmt.Sprintf(" token=%d", o.Token)
		if o.Slot != 0 {
			s += fmt.Sprintf(" slot=%d", o.Slot)
		}
	case o.Err != nil:
		s += " err=" + errNames[o.Err]
	}
	return s
}

func formatState(s *State) string {
	var b strings.Builder
	b.WriteString(formatTable(s))
	for _, id := range s.Sessions() {
		si, _ := s.Session(id)
		fmt.Fprintf(&b, "\nsession %d timeout=%d opened-at=%d floor=%d serial=%d ack=%d epoch=%d holdings=%d",
			id, si.TimeoutMs, si.OpenedAt, si.Floor, si.Serial, si.Ack, si.Epoch, si.Holdings)
		for _, o := range s.SessionOutcomes(id) {
			b.WriteString("\n  " + formatOutcome(o))
		}
		for _, seq := range slices.Sorted(maps.Keys(s.sessions[id].waiters)) {
			sw, _ := s.SessionWaiter(id, seq)
			fmt.Fprintf(&b, "\n  queued seq=%d key=%s ref=%d", seq, sw.Key, sw.Ref)
			if sw.Keys != nil {
				fmt.Fprintf(&b, " block=%s", strings.Join(sw.Keys, ","))
			}
		}
	}
	for _, r := range s.Revokes() {
		b.WriteString("\n" + formatRevoke(r))
	}
	return b.String()
}

// formatRevoke is a revoke record as the scripts show it.
func formatRevoke(r Revoke) string {
	s := fmt.Sprintf("revoke-record key=%s token=%d who=%s at=%d owner=%s", r.Key, r.Token, r.Who, r.At, r.Owner)
	if r.Label != "" {
		s += " label=" + r.Label
	}
	if r.Permit {
		s += fmt.Sprintf(" slot=%d", r.Slot)
	}
	if r.Keys != nil {
		s += " block=" + strings.Join(r.Keys, ",")
	}
	return s + fmt.Sprintf(" reason=%q", r.Reason)
}

// formatTable is formatState without the sessions' own lines.
func formatTable(s *State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "last-token=%d held=%d waiting=%d", s.LastToken(), s.NumHeld(), s.NumWaiting())
	if s.NumReserved() > 0 || s.NumBlocks() > 0 {
		fmt.Fprintf(&b, " reserved=%d blocks=%d", s.NumReserved(), s.NumBlocks())
	}
	if s.NumRenewed() > 0 {
		fmt.Fprintf(&b, " renewed=%d", s.NumRenewed())
	}
	if s.NumSessions() > 0 {
		fmt.Fprintf(&b, " sessions=%d", s.NumSessions())
	}
	if s.NumSemaphores() > 0 {
		fmt.Fprintf(&b, " semaphores=%d permits-held=%d", s.NumSemaphores(), s.NumPermitsHeld())
	}
	if s.NumRevokes() > 0 {
		fmt.Fprintf(&b, " revokes=%d", s.NumRevokes())
	}
	keys := s.sortedKeys()
	keys = append(keys, s.Semaphores()...)
	slices.Sort(keys)
	for _, k := range keys {
		if m, ok := s.Semaphore(k); ok {
			fmt.Fprintf(&b, "\n%s: semaphore permits=%d held=%d", k, m.Permits, m.Held)
			for _, h := range s.PermitHolders(k) {
				fmt.Fprintf(&b, "\n  permit slot=%d owner=%s token=%d lease=%d granted-at=%d",
					h.Slot, h.Owner, h.Token, h.LeaseSec, h.GrantedAt)
				if h.RenewedAt != 0 {
					fmt.Fprintf(&b, " renewed=%d", h.RenewedAt)
				}
				if h.Session != 0 {
					fmt.Fprintf(&b, " session=%d seq=%d", h.Session, h.Seq)
				}
				if h.Label != "" {
					fmt.Fprintf(&b, " label=%s", h.Label)
				}
			}
			formatWaiters(&b, s, k)
			continue
		}
		if h, ok := s.Holder(k); ok {
			fmt.Fprintf(&b, "\n%s: holder owner=%s token=%d lease=%d granted-at=%d",
				k, h.Owner, h.Token, h.LeaseSec, h.GrantedAt)
			if h.RenewedAt != 0 {
				fmt.Fprintf(&b, " renewed=%d", h.RenewedAt)
			}
			if h.Keys != nil {
				fmt.Fprintf(&b, " block=%s", strings.Join(h.Keys, ","))
			}
			if h.Session != 0 {
				fmt.Fprintf(&b, " session=%d seq=%d", h.Session, h.Seq)
			}
			if h.Label != "" {
				fmt.Fprintf(&b, " label=%s", h.Label)
			}
		} else {
			fmt.Fprintf(&b, "\n%s: reserved", k)
		}
		formatWaiters(&b, s, k)
	}
	return b.String()
}

// formatWaiters writes the waiters of key's queue, head first.
func formatWaiters(b *strings.Builder, s *State, k string) {
	for _, w := range s.Waiters(k) {
		fmt.Fprintf(b, "\n  waiter owner=%s ref=%d lease=%d wait=%d enqueued-at=%d",
			w.Owner, w.Ref, w.LeaseSec, w.WaitMs, w.EnqueuedAt)
		if w.Keys != nil {
			fmt.Fprintf(b, " block=%s", strings.Join(w.Keys, ","))
		}
		if w.Session != 0 {
			fmt.Fprintf(b, " session=%d seq=%d", w.Session, w.Seq)
		}
		if l := s.WaiterLabel(k, w); l != "" {
			fmt.Fprintf(b, " label=%s", l)
		}
	}
}

// normalLabel is a label as the codec carries it: one the codec cannot
// carry becomes badLabel, which Apply rejects as it rejects the original.
func normalLabel(l string) string {
	if len(l) > MaxLabelLen {
		return badLabel
	}
	return l
}

// normalize clears the fields cmd.Op does not use: that is exactly what the
// codec carries.
func normalize(c Command) Command {
	n := Command{Op: c.Op, Key: c.Key}
	if c.Session != 0 && sessionBearing(c.Op) {
		n.Session, n.Seq, n.Ack = c.Session, c.Seq, c.Ack
	}
	switch c.Op {
	case OpAcquire, OpAcquirePermit:
		n.Now, n.Owner, n.Ref, n.LeaseSec, n.WaitMs = c.Now, c.Owner, c.Ref, c.LeaseSec, c.WaitMs
		n.Label = normalLabel(c.Label)
	case OpSetPermits:
		n.Now, n.Permits, n.Ref = c.Now, c.Permits, c.Ref
	case OpRelease:
		n.Now, n.Owner, n.Token, n.Ref = c.Now, c.Owner, c.Token, c.Ref
	case OpExpire:
		n.Now, n.Token = c.Now, c.Token
	case OpCancelWait:
		n.Ref = c.Ref
	case OpExtend:
		n.Now, n.Owner, n.Token, n.Ref, n.LeaseSec = c.Now, c.Owner, c.Token, c.Ref, c.LeaseSec
	case OpDropWaiters, OpDropSessionless:
		n.Key = ""
	case OpOpenSession:
		n.Key, n.Now, n.Session, n.SecretHash, n.TimeoutMs = "", c.Now, c.Session, c.SecretHash, c.TimeoutMs
		if len(n.SecretHash) > SecretHashLen {
			n.SecretHash = ""
		}
	case OpResumeSession:
		n.Key, n.Session, n.Seq, n.Ack, n.Epoch = "", c.Session, c.Seq, c.Ack, c.Epoch
	case OpExpireSession:
		n.Key, n.Now, n.Session, n.Epoch = "", c.Now, c.Session, c.Epoch
		if len(c.Tokens) > 0 {
			n.Tokens = slices.Clone(c.Tokens)
		}
	case OpRevoke:
		n.Now, n.Owner, n.Token, n.Ref, n.Reason = c.Now, c.Owner, c.Token, c.Ref, c.Reason
		if len(n.Reason) > MaxReasonLen {
			n.Reason = badReason
		}
	case OpCloseSession:
		n.Key, n.Now, n.Session = "", c.Now, c.Session
	case OpAckSession:
		n.Key, n.Session, n.Ack = "", c.Session, c.Ack
	case OpAcquireBlock:
		n.Key = ""
		n.Now, n.Owner, n.Ref, n.LeaseSec, n.WaitMs = c.Now, c.Owner, c.Ref, c.LeaseSec, c.WaitMs
		n.Label = normalLabel(c.Label)
		if len(c.Keys) > 0 && len(c.Keys) <= MaxBlockKeys {
			n.Keys = make([]string, len(c.Keys))
			for i, k := range c.Keys {
				if len(k) <= MaxKeyLen {
					n.Keys[i] = k
				}
			}
		}
	}
	if len(n.Key) > MaxKeyLen {
		n.Key = ""
	}
	if len(n.Owner) > MaxOwnerLen {
		n.Owner = ""
	}
	return n
}

func snapshotBytes(t testing.TB, s *State) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := s.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// checkSnapshotRoundTrip restores s from its snapshot and checks that the
// copy writes the same bytes and answers every query the same way.
func checkSnapshotRoundTrip(t testing.TB, s *State) *State {
	t.Helper()
	b := snapshotBytes(t, s)
	r, err := ReadSnapshot(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if b2 := snapshotBytes(t, r); !bytes.Equal(b, b2) {
		t.Fatalf("snapshot round trip differs:\n%x\n%x", b, b2)
	}
	if err := checkInvariants(r); err != nil {
		t.Fatalf("restored: %v", err)
	}
	if formatState(s) != formatState(r) {
		t.Fatalf("restored state differs:\n%s\n%s", formatState(s), formatState(r))
	}
	return r
}

// checkInvariants checks the internal consistency of s: what Apply relies on
// and what the package promises.
func checkInvariants(s *State) error {
	waiting, reserved := 0, 0
	tokens := map[uint64][]string{}
	blockSeen := map[uint64][]string{} // queued block ref -> keys it was met on
	for k, e := range s.keys {
		if e == nil {
			return fmt.Errorf("key %q: nil entry", k)
		}
		if ValidateKey(k) != nil {
			return fmt.Errorf("key %q: invalid key", k)
		}
		if e.token == 0 {
			reserved++
			if e.owner != "" || e.queue.len() == 0 || e.queue.head().Keys == nil {
				// A free key with waiters would let a newcomer cut the line.
				return fmt.Errorf("key %q: unheld, and not reserved for a block %+v", k, e.queue)
			}
			if s.grantable(*e.queue.head()) {
				return fmt.Errorf("key %q: reserved for a block that could be granted", k)
			}
		} else {
			if ValidateOwner(e.owner) != nil || e.token > s.last {
				return fmt.Errorf("key %q: invalid holder %+v (last %d)", k, e.holder(), s.last)
			}
			tokens[e.token] = append(tokens[e.token], k)
		}
		if err := e.queue.check(); err != nil {
			return fmt.Errorf("key %q: %w", k, err)
		}
		refs := map[uint64]bool{}
		for _, w := range e.queue.waiters() {
			if refs[w.Ref] {
				return fmt.Errorf("key %q: ref %d queued twice", k, w.Ref)
			}
			refs[w.Ref] = true
			if w.WaitMs == 0 {
				return fmt.Errorf("key %q: queued waiter with wait 0", k)
			}
			if w.Keys == nil {
				waiting++
				continue
			}
			if !slices.Contains(w.Keys, k) || !slices.Equal(s.blockWaiters[w.Ref], w.Keys) {
				return fmt.Errorf("key %q: block waiter %+v not indexed as such", k, w)
			}
			if blockSeen[w.Ref] == nil {
				waiting++
			}
			blockSeen[w.Ref] = append(blockSeen[w.Ref], k)
		}
		if (e.queue.len() > 0) != (s.queued[k] == e) {
			return fmt.Errorf("key %q: queued index out of step", k)
		}
	}
	if err := checkSemaphores(s, tokens, &waiting); err != nil {
		return err
	}
	for ref, ks := range blockSeen {
		if len(ks) != len(s.blockWaiters[ref]) {
			return fmt.Errorf("block ref %d queued on %q, its keys are %q", ref, ks, s.blockWaiters[ref])
		}
	}
	if len(blockSeen) != len(s.blockWaiters) {
		return fmt.Errorf("%d block waiters indexed, %d queued", len(s.blockWaiters), len(blockSeen))
	}
	for t, ks := range tokens {
		b, isBlock := s.blocks[t]
		switch {
		case !isBlock && len(ks) > 1:
			return fmt.Errorf("token %d held by %q", t, ks)
		case isBlock && len(ks) != len(b):
			return fmt.Errorf("token %d held by %q, its block is %q", t, ks, b)
		}
	}
	for t, b := range s.blocks {
		if len(tokens[t]) != len(b) {
			return fmt.Errorf("block %d (%q) held by %q", t, b, tokens[t])
		}
	}
	for t := range s.renewed {
		// A renewal outliving its holding would make every later
		// snapshot unreadable.
		if len(tokens[t]) == 0 {
			return fmt.Errorf("renewal of token %d, which holds no key", t)
		}
	}
	for t, l := range s.labels {
		// Likewise a label outliving its holding.
		if len(tokens[t]) == 0 || ValidateLabel(l) != nil || l == "" {
			return fmt.Errorf("label %q of token %d, which holds no key", l, t)
		}
	}
	for r, l := range s.waiterLabels {
		// A waiter's label outliving its place in the queue would be
		// given to nobody, and be written into snapshots forever.
		q := s.queueOf(r.key)
		if q.find(r.ref) < 0 || ValidateLabel(l) != nil || l == "" {
			return fmt.Errorf("label %q of waiter %d on %q, which is not queued", l, r.ref, r.key)
		}
		if w := q.ws[q.find(r.ref)]; w.primary(r.key) != r.key {
			return fmt.Errorf("label %q of block waiter %d filed under %q, not its first key", l, r.ref, r.key)
		}
	}
	for k := range s.queued {
		if s.keys[k] == nil {
			return fmt.Errorf("key %q: queue without entry", k)
		}
	}
	if waiting != s.waiting || reserved != s.reserved {
		return fmt.Errorf("waiting/reserved counts %d/%d, actual %d/%d", s.waiting, s.reserved, waiting, reserved)
	}
	if err := checkRevokeRecords(s); err != nil {
		return err
	}
	return checkSessionInvariants(s)
}

// checkRevokeRecords checks the audit records of revokes: within the
// bound, each key once, every field within its constraint, and a token
// that was issued (the holding it names has ended: a revoke ends it, and
// tokens are never reused, so no holding of the table has it).
func checkRevokeRecords(s *State) error {
	if len(s.revokes) > MaxRevokeRecords {
		return fmt.Errorf("%d revoke records, at most %d", len(s.revokes), MaxRevokeRecords)
	}
	seen := map[string]bool{}
	for _, r := range s.revokes {
		switch {
		case seen[r.Key] || ValidateKey(r.Key) != nil:
			return fmt.Errorf("revoke record of %q: twice or invalid", r.Key)
		case r.Token == 0 || r.Token > s.last || s.HeldUnder(r.Key, r.Token):
			return fmt.Errorf("revoke record of %q: token %d (last %d) outside 1..last or still held", r.Key, r.Token, s.last)
		case ValidateOwner(r.Who) != nil || ValidateReason(r.Reason) != nil || ValidateOwner(r.Owner) != nil || ValidateLabel(r.Label) != nil:
			return fmt.Errorf("revoke record of %q: invalid field %+v", r.Key, r)
		case !r.Permit && r.Slot != 0, r.Permit && r.Keys != nil:
			return fmt.Errorf("revoke record of %q: permit %v slot %d keys %q", r.Key, r.Permit, r.Slot, r.Keys)
		case r.Keys != nil && (validateBlockKeys(r.Keys) != nil || !slices.Contains(r.Keys, r.Key)):
			return fmt.Errorf("revoke record of %q: block %q", r.Key, r.Keys)
		}
		seen[r.Key] = true
	}
	return nil
}

// checkSemaphores checks every semaphore: a valid key that is no lock's,
// n in bounds, its slots, token index and slot bitmap in step, its
// queue sound and waiting only while n or more permits are held. Held
// tokens join tokens and queued waiters waiting.
func checkSemaphores(s *State, tokens map[uint64][]string, waiting *int) error {
	for k, m := range s.sems {
		if ValidateKey(k) != nil || s.keys[k] != nil {
			return fmt.Errorf("semaphore %q: invalid key or also a lock", k)
		}
		if m.permits < 1 || m.permits > MaxPermits {
			return fmt.Errorf("semaphore %q: %d permits", k, m.permits)
		}
		held := 0
		words := map[uint32]uint64{}
		for slot, p := range m.held {
			held++
			if slot >= MaxPermits || ValidateOwner(p.owner) != nil || p.token == 0 || p.token > s.last ||
				p.leaseSec < MinLeaseSec || p.leaseSec > MaxLeaseSec {
				return fmt.Errorf("semaphore %q: slot %d invalid permit %+v (last %d)", k, slot, p, s.last)
			}
			if got, ok := m.slotOf[p.token]; !ok || got != slot {
				return fmt.Errorf("semaphore %q: token %d of slot %d indexed at %d", k, p.token, slot, got)
			}
			words[slot/64] |= 1 << (slot % 64)
			tokens[p.token] = append(tokens[p.token], k)
		}
		if held != len(m.slotOf) || !maps.Equal(words, m.words) {
			return fmt.Errorf("semaphore %q: %d held, %d indexed, words %x, want %x", k, held, len(m.slotOf), m.words, words)
		}
		var full []uint32
		for w, word := range words {
			if word == ^uint64(0) {
				full = append(full, w)
			}
		}
		slices.Sort(full)
		if !slices.Equal(full, m.full) {
			return fmt.Errorf("semaphore %q: full words %v, want %v", k, m.full, full)
		}
		if held < int(m.permits) {
			// The lowest free slot is below n whenever a grant may happen.
			lowest := uint32(0)
			for m.held[lowest] != (permit{}) {
				lowest++
			}
			if got := m.lowestFree(); got != lowest || got >= m.permits {
				return fmt.Errorf("semaphore %q: lowest free slot %d, want %d (n %d)", k, got, lowest, m.permits)
			}
		}
		if m.queue.len() > 0 && held < int(m.permits) {
			// A waiter with a free permit in front of it: the line is stuck.
			return fmt.Errorf("semaphore %q: %d waiters, %d of %d permits held", k, m.queue.len(), held, m.permits)
		}
		if m.queue != nil && m.queue.len() == 0 {
			return fmt.Errorf("semaphore %q: empty queue kept", k)
		}
		if err := m.queue.check(); err != nil {
			return fmt.Errorf("semaphore %q: %w", k, err)
		}
		refs := map[uint64]bool{}
		for _, w := range m.queue.waiters() {
			if refs[w.Ref] || w.WaitMs == 0 || w.Keys != nil {
				return fmt.Errorf("semaphore %q: bad waiter %+v", k, w)
			}
			refs[w.Ref] = true
			*waiting++
		}
	}
	return nil
}

// checkSessionInvariants checks the sessions against the table: each
// session's indexes name exactly its queued waiters and its holdings, and
// its outcomes are serials ack+1..serial with their seqs indexed.
func checkSessionInvariants(s *State) error {
	waiters := map[uint64]map[uint64]sessionWaiter{} // session -> seq -> where
	holdings := map[uint64]map[uint64]string{}       // session -> token -> key
	for k, e := range s.keys {
		if e.token != 0 && e.session != 0 {
			key := k
			if b := s.blocks[e.token]; b != nil {
				key = b[0]
			}
			if holdings[e.session] == nil {
				holdings[e.session] = map[uint64]string{}
			}
			holdings[e.session][e.token] = key
			if e.seq == 0 {
				return fmt.Errorf("key %q: session %d holding with seq 0", k, e.session)
			}
		}
		if e.token == 0 && e.session != 0 {
			return fmt.Errorf("key %q: reserved with session %d", k, e.session)
		}
		for _, w := range e.queue.waiters() {
			if w.Session == 0 {
				if w.Seq != 0 {
					return fmt.Errorf("key %q: waiter %d without session has seq %d", k, w.Ref, w.Seq)
				}
				continue
			}
			if waiters[w.Session] == nil {
				waiters[w.Session] = map[uint64]sessionWaiter{}
			}
			sw := sessionWaiter{key: w.primary(k), ref: w.Ref}
			if old, dup := waiters[w.Session][w.Seq]; dup && (old != sw || w.Keys == nil) {
				return fmt.Errorf("session %d seq %d queued twice: %+v %+v", w.Session, w.Seq, old, sw)
			}
			waiters[w.Session][w.Seq] = sw
		}
	}
	for k, m := range s.sems {
		for _, p := range m.held {
			if p.session == 0 {
				continue
			}
			if holdings[p.session] == nil {
				holdings[p.session] = map[uint64]string{}
			}
			holdings[p.session][p.token] = k
			if p.seq == 0 {
				return fmt.Errorf("semaphore %q: session %d permit with seq 0", k, p.session)
			}
		}
		for _, w := range m.queue.waiters() {
			if w.Session == 0 {
				continue
			}
			if waiters[w.Session] == nil {
				waiters[w.Session] = map[uint64]sessionWaiter{}
			}
			sw := sessionWaiter{key: k, ref: w.Ref}
			if old, dup := waiters[w.Session][w.Seq]; dup {
				return fmt.Errorf("session %d seq %d queued twice: %+v %+v", w.Session, w.Seq, old, sw)
			}
			waiters[w.Session][w.Seq] = sw
		}
	}
	for id := range waiters {
		if s.sessions[id] == nil {
			return fmt.Errorf("waiters of session %d, which does not exist", id)
		}
	}
	for id := range holdings {
		if s.sessions[id] == nil {
			return fmt.Errorf("holdings of session %d, which does not exist", id)
		}
	}
	for id, ss := range s.sessions {
		if id == 0 || len(ss.hash) != SecretHashLen {
			return fmt.Errorf("session %d: bad id or hash", id)
		}
		if !maps.Equal(ss.waiters, waiters[id]) && len(ss.waiters)+len(waiters[id]) > 0 {
			return fmt.Errorf("session %d: waiters index %v, queued %v", id, ss.waiters, waiters[id])
		}
		if !maps.Equal(ss.holdings, holdings[id]) && len(ss.holdings)+len(holdings[id]) > 0 {
			return fmt.Errorf("session %d: holdings index %v, held %v", id, ss.holdings, holdings[id])
		}
		if ss.ack > ss.serial || uint64(len(ss.outcomes)) != ss.serial-ss.ack || len(ss.bySeq) != len(ss.outcomes) {
			return fmt.Errorf("session %d: ack %d serial %d, %d outcomes, %d indexed", id, ss.ack, ss.serial, len(ss.outcomes), len(ss.bySeq))
		}
		for i, o := range ss.outcomes {
			if o.Serial != ss.ack+1+uint64(i) || ss.bySeq[o.Seq] != o.Serial || o.Seq == 0 {
				return fmt.Errorf("session %d: outcome #%d %+v out of place", id, i, o)
			}
			if _, queued := ss.waiters[o.Seq]; queued {
				return fmt.Errorf("session %d: seq %d queued and with an outcome", id, o.Seq)
			}
		}
	}
	return nil
}
