package leader

import (
	"fmt"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Revoke takes an operator's revoke, which the admin port passes on: end
// the holding of key under token, by the operator by, for reason. It is
// request id of connection h (opened; the node opens one per admin
// request), whose one reply is K with the revoked token in Msg.Token,
// E (invalid_reason and the other field errors, not_held,
// token_mismatch, not_supported before cluster version 14), M (this node
// does not serve) or U (leadership was lost before it applied: it may
// yet commit). Like a release it goes through the log, and the next
// waiter is granted in the same commit; unlike one it carries no owner
// of the holding and no session: the token alone names what ends, so a
// revoke decided on an older look at the key changes nothing.
func (k *Core[C]) Revoke(now time.Time, h C, id uint64, key string, token uint64, by, reason string) {
	cn := k.conns[h]
	if cn == nil {
		k.rd.Sends = append(k.rd.Sends, Send[C]{To: h, Msg: wire.Msg{Type: wire.TypeError, ID: id,
			Code: wire.CodeInternal, Text: "connection not open"}})
		return
	}
	cmd := locksm.Command{Op: locksm.OpRevoke, Key: key, Owner: by, Token: token, Reason: reason}
	if err := locksm.ValidateCommand(cmd); err != nil {
		k.reply(cmd.Op, OutcomeError)
		k.send(cn, errReply(id, err))
		return
	}
	if _, dup := cn.inflight[id]; dup {
		k.reply(cmd.Op, OutcomeError)
		k.send(cn, wire.Msg{Type: wire.TypeError, ID: id, Code: wire.CodeDuplicateID, Text: "request id already in flight"})
		return
	}
	if !k.serving {
		addr, lid := k.hint()
		k.reply(cmd.Op, OutcomeMoved)
		k.send(cn, wire.Msg{Type: wire.TypeMoved, ID: id, LeaderAddr: addr, LeaderID: lid})
		return
	}
	if v := k.table.ClusterVersion(); v < wire.VersionRevoke {
		// Older members could not decode op 16: their tables would
		// diverge from the others'.
		k.reply(cmd.Op, OutcomeError)
		k.send(cn, errReply(id, fmt.Errorf("%w: revokes need every member at protocol version %d; the cluster version is %d (upgrade every node; the leader records the new version within %s)",
			wire.ErrNotSupported, wire.VersionRevoke, v, "30s")))
		return
	}
	k.nextRef++
	cmd.Ref = k.nextRef
	p := &pending[C]{conn: cn, id: id, op: cmd.Op, key: key, owner: by, ref: cmd.Ref, start: now}
	k.pend[p.ref] = p
	cn.owe(p)
	k.propose(cmd)
}

// revokeApplied handles a revoke a's that ended a holding: a leader
// tells the holder (the lost event, before the hand-off grants of the
// same commit, which Applied answers after this), the token leaves the
// bookkeeping of told and untold grants as a release's does, and every
// node, leading or not, puts the audit record in its events, once. Its
// lease timer, still armed, finds the token gone and proposes nothing.
func (k *Core[C]) revokeApplied(a *Applied) {
	c := &a.Cmd
	token := a.Res.Token
	var rv *locksm.Revoke
	for _, e := range a.Effects {
		if e.Kind == locksm.EffectRevoked && e.Token == token {
			_, permit := k.table.Semaphore(c.Key)
			r := locksm.Revoke{Key: c.Key, Keys: e.Keys, Token: token, Who: c.Owner, Reason: c.Reason, At: c.Now,
				Owner: e.Owner, Permit: permit, Slot: e.Slot, Session: e.Session}
			rv = &r
			if k.leading {
				k.tellRevoked(e, c)
			}
			break
		}
	}
	delete(k.told, token)
	delete(k.untold, token)
	if rv != nil {
		// Every node audits every revoke it applies, once, leading or
		// not: gated on leading, one revoke was audited twice across a
		// leader change, or by nobody (issue 42's second attack round).
		k.event(Event{Kind: EventRevoked, Revoke: rv, Leading: k.leading, Index: a.Index})
	}
}

// tellRevoked sends the lost event of the revoked holding e (revoke c),
// with who and why, to its holder: a session's to the connection the
// session is attached to here, whichever that is now (a broker that
// resumed on a new connection while the node still holds the old one
// open hears it there), or, with none, when its broker resumes
// (resumed tells the session's revokes); any other to the connection
// its grant was told on while that is open, else through the event every
// open version 14 connection is sent, which names neither who nor why
// (that is for the holder alone; both found by issue 42's attack round).
func (k *Core[C]) tellRevoked(e locksm.Effect, c *locksm.Command) {
	m := wire.Msg{Type: wire.TypeLost, Token: e.Token, Reason: wire.LostRevoked, Key: e.Key, Owner: c.Owner, Text: c.Reason}
	if e.Session != 0 {
		// A session's broker hears it on its attached connection, or,
		// away, when it resumes: nobody else needs it.
		if s := k.sessions[e.Session]; s != nil {
			if cn := attachedConn(s); cn != nil && !cn.dead && cn.version >= wire.VersionRevoke {
				k.send(cn, m)
				k.event(Event{Kind: EventLostSent, Keys: 1})
			}
		}
		return
	}
	if cn := k.told[e.Token]; cn != nil && !cn.dead {
		if cn.version >= wire.VersionRevoke {
			k.send(cn, m)
			k.event(Event{Kind: EventLostSent, Keys: 1})
		}
		return
	}
	m.Owner, m.Text = "", ""
	k.tellLostMsg(m, wire.VersionRevoke)
}

// handedTo is the token the first hand-off among effects granted (0:
// none): whom a revoke handed the key on to.
func handedTo(effects []locksm.Effect) uint64 {
	for _, e := range effects {
		if e.Kind == locksm.EffectGranted {
			return e.Token
		}
	}
	return 0
}

// tellSessionRevokes tells cn, the connection session s just resumed
// on, of the revokes of s's holdings the state keeps for its broker
// (locksm.SessionRevoke: every one whose holding's lease may still run
// by the broker's clock): the broker may have been away when they
// applied, or may hear of a grant only now, in the outcomes replayed
// before (the lost event must follow the G: the multi-leader simulation
// found a broker counting on a holding revoked before it heard of it). A
// broker ignores the tokens it does not hold. later is the rest of the
// resume's batch: a revoke there, applied after the resume, is told when
// it applies, after the grant it ends (issue 42's second attack round
// saw X, then G, then X). Older connections cannot take the event.
func (k *Core[C]) tellSessionRevokes(cn *conn[C], s *session[C], later []Applied) {
	if cn.version < wire.VersionRevoke {
		return
	}
	for _, rv := range k.table.SessionRevokes(s.id) {
		if revokedIn(later, rv.Token) {
			continue
		}
		k.send(cn, wire.Msg{Type: wire.TypeLost, Token: rv.Token, Reason: wire.LostRevoked, Key: rv.Key, Owner: rv.Who, Text: rv.Reason})
		k.event(Event{Kind: EventLostSent, Keys: 1})
	}
}

// revokedIn reports whether one of batch revoked token.
func revokedIn(batch []Applied, token uint64) bool {
	for i := range batch {
		if c := &batch[i].Cmd; c.Op == locksm.OpRevoke && c.Token == token && batch[i].Res.Status == locksm.StatusRevoked {
			return true
		}
	}
	return false
}
