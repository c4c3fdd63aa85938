package sidecar

import (
	"time"
)

// The locks held through the broker (Broker.held): what Close reports
// lost and releases (issue 39, attack round 4). A lock is registered when
// its grant is delivered to its caller (answerLocked) and forgotten when
// its caller releases it (ReleaseAsync), the broker compensates it
// (Compensate), it is reported lost (fireLost), or, swept lazily, its
// lease has surely ended.

// heldLock is one registered holding.
type heldLock struct {
	lock Lock
	// end is the latest the cluster may end the holding: the grant's
	// arrival + its lease, pushed on by every extend (its start + the
	// release deadline + its lease). Past it (and a slack), the entry is
	// swept: nothing of it is left to release.
	end time.Time
}

// heldSlack is added to a holding's end before it is swept: clock drift,
// and an extend applied at the very end of its deadline.
func heldSlack(lease time.Duration) time.Duration { return time.Second + lease/100 }

// minHeldSweep is the fewest registered holdings at which registering
// sweeps out ended ones (then twice what is left).
const minHeldSweep = 1024

// holdLocked registers l, a grant about to be delivered. Requires qmu (so
// that Close, which sets qclosed under qmu, sees every lock registered
// before it).
func (b *Broker) holdLocked(l Lock) {
	now := b.cfg.Now()
	b.hmu.Lock()
	defer b.hmu.Unlock()
	if len(b.held) >= max(b.heldSweep, minHeldSweep) {
		for tok, h := range b.held {
			if now.After(h.end.Add(heldSlack(h.lock.Lease))) {
				delete(b.held, tok)
			}
		}
		b.heldSweep = 2 * len(b.held)
	}
	b.held[l.Token] = &heldLock{lock: l, end: now.Add(l.Lease)}
}

// unhold forgets the holding under token (released, compensated, lost).
func (b *Broker) unhold(token uint64) (was bool) {
	b.hmu.Lock()
	_, was = b.held[token]
	delete(b.held, token)
	b.hmu.Unlock()
	return was
}

// extending records an extend of the holding under token to lease,
// started at start: the cluster may end it as late as start + the release
// deadline (the extend's last attempt) + lease.
func (b *Broker) extending(token uint64, start time.Time, lease time.Duration) {
	b.hmu.Lock()
	defer b.hmu.Unlock()
	if h := b.held[token]; h != nil {
		if end := start.Add(b.cfg.ReleaseDeadline + lease); end.After(h.end) {
			h.end = end
		}
	}
}

// extended records an extend's success (the holding's new Lock).
func (b *Broker) extended(l Lock) {
	b.hmu.Lock()
	defer b.hmu.Unlock()
	if h := b.held[l.Token]; h != nil {
		h.lock.Lease, h.lock.ValidUntil = l.Lease, l.ValidUntil
	}
}

// takeHeld returns every registered holding and forgets them (Close).
func (b *Broker) takeHeld() []Lock {
	b.hmu.Lock()
	defer b.hmu.Unlock()
	b.heldTaken.Store(true) // no grant registers any more (qclosed): held stays empty
	ls := make([]Lock, 0, len(b.held))
	for _, h := range b.held {
		ls = append(ls, h.lock)
	}
	clear(b.held)
	return ls
}

// heldCount is how many holdings are registered (tests).
func (b *Broker) heldCount() int {
	b.hmu.Lock()
	defer b.hmu.Unlock()
	return len(b.held)
}

// cancelSentLocked asks the node to cancel every acquire written and not
// over (Close): a waiter leaves its line, and a grant that wins the race
// is answered ErrClosed and released (answerLocked). Requires qmu.
func (b *Broker) cancelSentLocked() {
	for o := range b.sent {
		if o.answered || o.conn == nil || o.call == nil {
			continue
		}
		o.closing = true
		b.giveUpLocked(o)
	}
	b.sentIdle = make(chan struct{})
	if len(b.sent) == 0 {
		close(b.sentIdle)
	}
}

// unsentLocked takes o off the acquires written and not over; the last
// one to go while the broker closes wakes Close. Requires qmu.
func (b *Broker) unsentLocked(o *acqOp) {
	if _, ok := b.sent[o]; !ok {
		return
	}
	delete(b.sent, o)
	if len(b.sent) == 0 && b.sentIdle != nil {
		select {
		case <-b.sentIdle:
		default:
			close(b.sentIdle)
		}
	}
}

// waitSent waits, at most d, for the acquires written before Close to end.
func (b *Broker) waitSent(d time.Duration) {
	b.qmu.Lock()
	idle := b.sentIdle
	b.qmu.Unlock()
	select {
	case <-idle:
		return
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	}
}
