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
		s.recordRevoke(cmd, nil, Revoke{Owner: p.owner, Label: s.labels[p.token], Permit: true, Slot: slot, Session: p.session})
		s.noteSessionRevoke(cmd, p.session, p.token, cmd.Key, s.leaseEndOf(p.token, p.grantedAt, p.leaseSec))
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
	keys := s.blocks[e.token] // nil for a single key
	s.recordRevoke(cmd, keys, Revoke{Owner: e.owner, Label: s.labels[e.token], Session: e.session})
	primary := cmd.Key
	if keys != nil {
		primary = keys[0]
	}
	s.noteSessionRevoke(cmd, e.session, e.token, primary, s.leaseEndOf(e.token, e.grantedAt, e.leaseSec))
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

// leaseEndOf is the lease end (Unix ms) of the holding under token
// granted at grantedAt with leaseSec: from its latest extend's stamp if
// it was extended.
func (s *State) leaseEndOf(token uint64, grantedAt int64, leaseSec uint32) int64 {
	return max(grantedAt, s.renewed[token]) + int64(leaseSec)*1000
}

// noteSessionRevoke keeps the revoke cmd of the holding under token of
// session (0: none, nothing kept) for the session's broker (see
// SessionRevoke): the notes of ended sessions, and of holdings whose
// lease (and slack) is over by cmd.Now, go; then the oldest, to keep at
// most MaxSessionRevokes. A new slice: a Frozen view may share the old.
func (s *State) noteSessionRevoke(cmd *Command, session, token uint64, key string, leaseEnd int64) {
	if session == 0 || s.sessions[session] == nil {
		return
	}
	next := make([]SessionRevoke, 0, len(s.sessRevoked)+1)
	for _, r := range s.sessRevoked {
		if s.sessions[r.Session] != nil && r.LeaseEnd+SessionRevokeSlackMs > cmd.Now {
			next = append(next, r)
		}
	}
	if drop := len(next) + 1 - MaxSessionRevokes; drop > 0 {
		next = slices.Delete(next, 0, drop)
	}
	s.sessRevoked = append(next, SessionRevoke{Session: session, Token: token, Key: key, Who: intern(cmd.Owner),
		Reason: cmd.Reason, LeaseEnd: leaseEnd})
}

// forgetSessionRevokes drops the notes of session id, which ended: no
// broker resumes it. A new slice, as ever.
func (s *State) forgetSessionRevokes(id uint64) {
	if !slices.ContainsFunc(s.sessRevoked, func(r SessionRevoke) bool { return r.Session == id }) {
		return
	}
	next := slices.DeleteFunc(slices.Clone(s.sessRevoked), func(r SessionRevoke) bool { return r.Session == id })
	if len(next) == 0 {
		next = nil
	}
	s.sessRevoked = next
}

// SessionRevokes returns the revokes of session id's holdings kept for
// its broker (SessionRevoke), oldest first; nil if none: a leader tells
// them to the broker when it resumes.
func (s *State) SessionRevokes(id uint64) []SessionRevoke {
	var out []SessionRevoke
	for _, r := range s.sessRevoked {
		if r.Session == id {
			out = append(out, r)
		}
	}
	return out
}

// NumSessionRevokes is the number of SessionRevoke notes kept.
func (s *State) NumSessionRevokes() int { return len(s.sessRevoked) }

// Revokes returns a copy of the audit records kept, oldest first (nil if
// none): each key's latest revoke, in the log order of those revokes.
func (s *State) Revokes() []Revoke { return slices.Clone(s.revokes) }

// NumRevokes is the number of audit records kept (at most
// MaxRevokeRecords).
func (s *State) NumRevokes() int { return len(s.revokes) }
