package locksm

import "slices"

// revoke ends the holding of cmd.Key under cmd.Token (m: the semaphore
// cmd.Key names, if any) as an expiry would, owes its holder an
// EffectRevoked ahead of the hand-offs, and keeps the audit record. The
// token must match exactly: a revoke decided on an older look at the key
// must not end the holding that came after it.
func (s *State) revoke(m *semaphore, cmd *Command, effects []Effect) (result, []Effect) {
	if m != nil {
		slot, ok := m.slotOf[cmd.Token]
		if !ok {
			if m.numHeld() > 0 {
				return result{Status: StatusRejected, Err: ErrTokenMismatch}, effects
			}
			return result{Status: StatusRejected, Err: ErrNotHeld}, effects
		}
		p := m.held[slot]
		if s.revokesPending(p.session) {
			return result{Status: StatusRejected, Err: ErrRevokesPending}, effects
		}
		s.recordRevoke(cmd, nil, Revoke{Owner: p.owner, Label: s.labels[p.token], Permit: true, Slot: slot, Session: p.session})
		s.noteSessionRevoke(cmd, p.session, p.token, cmd.Key)
		effects = append(effects, Effect{Kind: EffectRevoked, Key: cmd.Key, Owner: p.owner, Token: p.token, Slot: slot,
			Session: p.session, Seq: p.seq})
		effects = s.endPermit(cmd.Key, m, slot, cmd.Now, effects)
		return result{Status: StatusRevoked, Token: p.token, N: slot}, effects
	}
	e := s.keys[cmd.Key]
	switch {
	case e == nil || e.token == 0:
		return result{Status: StatusRejected, Err: ErrNotHeld}, effects
	case e.token != cmd.Token:
		return result{Status: StatusRejected, Err: ErrTokenMismatch}, effects
	}
	if s.revokesPending(e.session) {
		return result{Status: StatusRejected, Err: ErrRevokesPending}, effects
	}
	keys := s.blocks[e.token] // nil for a single key
	s.recordRevoke(cmd, keys, Revoke{Owner: e.owner, Label: s.labels[e.token], Session: e.session})
	primary := cmd.Key
	if keys != nil {
		primary = keys[0]
	}
	s.noteSessionRevoke(cmd, e.session, e.token, primary)
	eff := Effect{Kind: EffectRevoked, Key: cmd.Key, Keys: keys, Owner: e.owner, Token: e.token, Session: e.session, Seq: e.seq}
	if keys != nil {
		eff.Key = keys[0]
	}
	// endHolding recycles e or hands it on: the result takes the token
	// from the effect, read before.
	effects = s.endHolding(cmd.Key, e, cmd.Now, append(effects, eff))
	return result{Status: StatusRevoked, Token: eff.Token}, effects
}

// recordRevoke keeps the audit record of revoke cmd, whose holding
// (owner, label, permit and slot in h) held keys (a block's) or cmd.Key
// alone: one record per key, replacing that key's older one, appended
// in the block's order. Then the oldest records go until at most
// MaxRevokeRecords are left: a FIFO by the log order of each key's latest
// revoke, the same on every replica. The slice is rebuilt, never written
// in place (a Frozen view may share it); O(MaxRevokeRecords), and a
// revoke is an operator's rare act.
func (s *State) recordRevoke(cmd *Command, keys []string, h Revoke) {
	h.Token, h.Who, h.Reason, h.At, h.Keys = cmd.Token, intern(cmd.Owner), cmd.Reason, cmd.Now, keys
	revoked := keys
	if revoked == nil {
		revoked = []string{cmd.Key}
	}
	next := make([]Revoke, 0, len(s.revokes)+len(revoked))
	for _, r := range s.revokes {
		if !slices.Contains(revoked, r.Key) {
			next = append(next, r)
		}
	}
	if drop := len(next) + len(revoked) - MaxRevokeRecords; drop > 0 {
		next = slices.Delete(next, 0, drop) // next is this call's own
	}
	for _, k := range revoked {
		r := h
		r.Key = k
		next = append(next, r)
	}
	s.revokes = next
}

// LastRevoke returns the audit record of the latest revoke of key, if it
// is still kept (MaxRevokeRecords): for inspection. A revoke of a block
// left one on each of its keys.
func (s *State) LastRevoke(key string) (Revoke, bool) {
	for i := len(s.revokes) - 1; i >= 0; i-- {
		if s.revokes[i].Key == key {
			return s.revokes[i], true
		}
	}
	return Revoke{}, false
}

// revokesPending reports whether session (0: none) keeps
// MaxSessionRevokes notes already: a revoke of its holding is then
// refused (ErrRevokesPending) rather than forget one still owed.
func (s *State) revokesPending(session uint64) bool {
	return session != 0 && s.sessions[session] != nil && len(s.sessRevoked[session]) >= MaxSessionRevokes
}

// noteSessionRevoke keeps the revoke cmd of the holding under token of
// session (0: none, nothing kept) for the session's broker (see
// SessionRevoke); revoke refused it past MaxSessionRevokes. A new
// slice: a Frozen view may share the old.
func (s *State) noteSessionRevoke(cmd *Command, session, token uint64, key string) {
	ss := s.sessions[session]
	if session == 0 || ss == nil {
		return
	}
	old := s.sessRevoked[session]
	next := make([]SessionRevoke, 0, len(old)+1)
	next = append(next, old...)
	next = append(next, SessionRevoke{Session: session, Token: token, Key: key, Who: intern(cmd.Owner),
		Reason: cmd.Reason, AfterSerial: ss.serial})
	if s.sessRevoked == nil {
		s.sessRevoked = make(map[uint64][]SessionRevoke)
	}
	s.sessRevoked[session] = next
}

// sessionAcked drops the notes of session id that its ack (ss.ack) has
// passed: the broker acknowledged an outcome recorded after them, so it
// read them (SessionRevoke).
func (s *State) sessionAcked(id uint64, ss *session) {
	old := s.sessRevoked[id]
	if len(old) == 0 || old[0].AfterSerial >= ss.ack {
		return // in serial order: the oldest is passed first
	}
	i := 0
	for i < len(old) && old[i].AfterSerial < ss.ack {
		i++
	}
	if i == len(old) {
		delete(s.sessRevoked, id)
		return
	}
	s.sessRevoked[id] = slices.Clone(old[i:])
}

// forgetSessionRevokes drops the notes of session id, which ended: no
// broker resumes it.
func (s *State) forgetSessionRevokes(id uint64) { delete(s.sessRevoked, id) }

// SessionRevokes returns the revokes of session id's holdings kept for
// its broker (SessionRevoke), oldest first; nil if none: a leader tells
// them to the broker when it resumes.
func (s *State) SessionRevokes(id uint64) []SessionRevoke { return slices.Clone(s.sessRevoked[id]) }

// NumSessionRevokes is the number of SessionRevoke notes kept.
func (s *State) NumSessionRevokes() int {
	n := 0
	for _, rs := range s.sessRevoked {
		n += len(rs)
	}
	return n
}

// Revokes returns a copy of the audit records kept, oldest first (nil if
// none): each key's latest revoke, in the log order of those revokes.
func (s *State) Revokes() []Revoke { return slices.Clone(s.revokes) }

// NumRevokes is the number of audit records kept (at most
// MaxRevokeRecords).
func (s *State) NumRevokes() int { return len(s.revokes) }
