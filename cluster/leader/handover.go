package leader

import (
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// The core's part of a quiet planned hand-over (the caller chooses the
// target, waits, and runs the Raft transfer; see cluster/handover.go):
//
//	BeginHandOver    step 2: every connection that speaks notices is told
//	                 (NoticeHandOver naming the target); requests are
//	                 still taken until each has acknowledged
//	(acknowledgements arrive as TypeNoticeAck requests, or the connection
//	 closes; the last one stops serving at once)
//	StopServing      step 3, when the wait for acknowledgements is over:
//	                 lock requests get M naming the target, and every
//	                 queued waiter is withdrawn through the log (a cancel:
//	                 T once it commits); acquires queued later are
//	                 withdrawn when their command applies
//	Owed             step 4 waits for it to reach 0
//	EndHandOver      after the transfer: if it failed, serve again with a
//	                 fresh lease timer for every holder, and say so
//
// After a hand-over that did not fail, its target stays the leader hint of
// M replies until Raft knows a leader other than this node.

// HandOver is one hand-over of this node's leadership, from BeginHandOver
// to EndHandOver. Its state belongs to the core.
type HandOver struct {
	id, addr string // the target's server id and client address
	epoch    uint64 // the leadership epoch it started in
	// active until the hand-over has finished (either way). An inactive
	// one stays the core's hint while Raft knows no leader yet (between
	// stepping down and hearing from the new leader).
	active bool
	// stopped: serving stopped and waiters withdrawn (step 3).
	stopped bool
	unacked int // notified connections that have not acknowledged
}

// BeginHandOver starts handing leadership to server id at client address
// addr (at most 255 bytes, else it is named as ""). It returns the
// hand-over and how many connections were told; with none told, serving
// stops at once. ErrNotLeading, ErrHandOverActive: nothing changed.
func (k *Core[C]) BeginHandOver(id, addr string) (*HandOver, int, error) {
	if !k.leading || k.closed {
		return nil, 0, ErrNotLeading
	}
	if k.HandOverActive() {
		return nil, 0, ErrHandOverActive
	}
	if len(addr) > 255 {
		addr = ""
	}
	h := &HandOver{id: id, addr: addr, epoch: k.epoch, active: true}
	k.handover = h
	notice := wire.Msg{Type: wire.TypeNotice, Event: wire.NoticeHandOver, LeaderID: id, LeaderAddr: addr}
	for _, cn := range k.sortedConns() {
		if cn.version >= wire.VersionNotices && !cn.dead {
			cn.ackPending = true
			h.unacked++
			k.send(cn, notice)
		}
	}
	notified := h.unacked
	if h.unacked == 0 {
		k.stopServing(h)
	}
	return h, notified, nil
}

// HandOverActive reports whether a hand-over has begun and not ended.
func (k *Core[C]) HandOverActive() bool { return k.handover != nil && k.handover.active }

// HandOverStopped reports whether h has stopped serving (step 3): every
// told connection acknowledged, or StopServing was called.
func (k *Core[C]) HandOverStopped(h *HandOver) bool { return h.stopped }

// StopServing is step 3 once the wait for acknowledgements is over (if the
// last one has not done it already). ErrNotLeading: leadership changed
// since BeginHandOver; the hand-over is over and forgotten.
func (k *Core[C]) StopServing(h *HandOver) error {
	if k.epoch != h.epoch {
		k.handover = nil
		return ErrNotLeading
	}
	if !h.stopped {
		k.stopServing(h)
	}
	return nil
}

// EndHandOver ends h after the Raft transfer. transferFailed: this node
// still leads; it serves again if it still leads in h's epoch, was ready
// and is not closing, with a fresh lease timer for every holder from now
// (expiries proposed during the transfer were refused), the cancels of
// waits that ended meanwhile proposed again (recancelWaits), and tells
// its connections. Otherwise h's target stays the leader hint.
func (k *Core[C]) EndHandOver(now time.Time, h *HandOver, transferFailed bool) {
	h.active = false
	if !transferFailed {
		return
	}
	if k.handover == h {
		k.handover = nil
	}
	if !k.leading || k.epoch != h.epoch || !k.ready || k.closed {
		return
	}
	k.armHolders(now)
	k.rearmSessions(now)
	k.recancelWaits(now)
	k.rereleaseRefused()
	k.serving = true
	k.broadcastServing()
}

// recancelWaits proposes again, when serving resumes after a hand-over
// that failed, the cancel of every queued acquire that was to leave its
// queue: one whose caller (or the hand-over's withdrawal) cancelled it,
// and one whose wait ran out. While Raft moved leadership it refused new
// entries, those cancels among them, and their refusal answers nobody (the
// waiter's reply is owed by its cancel's apply), so without this a waiter
// kept its place with no wait bound left (issue 39, finding 11). A cancel
// that was appended after all and applies first makes this one a Noop.
func (k *Core[C]) recancelWaits(now time.Time) {
	for _, p := range sortedByRef(k.pend) {
		if p.acquire() && p.queued && (p.cancel || !p.deadline.After(now)) {
			k.propose(locksm.Command{Op: locksm.OpCancelWait, Key: p.key, Ref: p.ref})
		}
	}
}

// rereleaseRefused proposes again, when serving resumes after a hand-over
// that failed, the releases of unusable grants that Raft refused while it
// transferred (ProposalFailed keeps them), where the key is still held
// under the grant's token.
func (k *Core[C]) rereleaseRefused() {
	for _, c := range k.refusedReleases {
		if k.table.HeldUnder(cmdKey(&c), c.Token) {
			k.propose(c)
		}
	}
	clear(k.refusedReleases)
	k.refusedReleases = k.refusedReleases[:0]
}

// stopServing is step 3.
func (k *Core[C]) stopServing(h *HandOver) {
	h.stopped = true
	k.serving = false
	for _, p := range sortedByRef(k.pend) {
		// A session's waiter keeps its place: its broker resumes it on
		// the target.
		if p.acquire() && p.queued && !p.cancel && p.session() == nil {
			p.cancel = true
			k.propose(locksm.Command{Op: locksm.OpCancelWait, Key: p.key, Ref: p.ref})
		}
	}
}

// withdrawing reports whether an acquire queued now must be withdrawn at
// once (a hand-over stopped serving).
func (k *Core[C]) withdrawing() bool {
	return k.handover != nil && k.handover.active && k.handover.stopped
}

// noticeAcked records cn's acknowledgement of the hand-over notice; the
// last one stops serving.
func (k *Core[C]) noticeAcked(cn *conn[C]) {
	if !cn.ackPending {
		return
	}
	cn.ackPending = false
	h := k.handover
	if h == nil || !h.active || h.stopped {
		return
	}
	if h.unacked--; h.unacked <= 0 {
		k.stopServing(h)
	}
}
