package cluster

import (
	"context"
	"fmt"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Revoke ends the holding of key under token on an operator's word (the
// admin port's AdminOpRevoke; `ticketing revoke`): by names the operator
// and reason says why, both kept in the replicated audit record and told
// to the holder. It goes through the leader core like any request, so the
// revoke commits through the log, the next waiter is granted in the same
// commit, and the holder's connection gets the lost event. It returns the
// audit record once the revoke applied here.
//
// Errors: locksm.ErrNotHeld or ErrTokenMismatch (nothing changed: the key
// is not held, or held under another token, as after a release and a new
// grant), locksm's field errors (ErrInvalidReason, ErrInvalidKey, ...),
// wire.ErrNotSupported (a member runs a version before 14), ErrNotLeader
// (this node does not serve), wire.ErrIndeterminate (proposed, outcome
// unknown: the leadership was lost, or ctx ended first; inspect the key's
// last revoke to learn it).
func (n *Node) Revoke(ctx context.Context, key string, token uint64, by, reason string) (wire.RevokeReport, error) {
	replies := make(chan wire.Msg, 1)
	cc := &clientConn{n: n, remote: "admin revoke", sink: func(m *wire.Msg) {
		select {
		case replies <- *m: // the one reply; anything after it is dropped
		default:
		}
	}}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return wire.RevokeReport{}, fmt.Errorf("%w: the node is closing", ErrNotLeader)
	}
	// Version 0: it takes no notices and no lost events of others.
	n.core.Open(cc, 0)
	n.core.Revoke(time.Now(), cc, 1, key, token, by, reason)
	n.performLocked()
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.core.Closed(time.Now(), cc)
		n.performLocked()
		n.mu.Unlock()
	}()
	var m wire.Msg
	select {
	case m = <-replies:
	case <-ctx.Done():
		return wire.RevokeReport{}, fmt.Errorf("%w: the revoke of %q token %d was proposed and has not applied yet: %w (inspect the key: its last revoke says whether it did)",
			wire.ErrIndeterminate, key, token, ctx.Err())
	case <-n.closing:
		return wire.RevokeReport{}, fmt.Errorf("%w: the node is closing; the revoke of %q token %d may yet commit (inspect the key)",
			wire.ErrIndeterminate, key, token)
	}
	switch m.Type {
	case wire.TypeOK:
	case wire.TypeError:
		return wire.RevokeReport{}, wire.RemoteErr(m.Code, m.Text)
	case wire.TypeMoved:
		return wire.RevokeReport{}, fmt.Errorf("%w: ask %q", ErrNotLeader, m.LeaderID)
	case wire.TypeUnknown:
		return wire.RevokeReport{}, fmt.Errorf("%w: the leadership changed before the revoke of %q token %d applied; it may yet commit (inspect the key: its last revoke says whether it did)",
			wire.ErrIndeterminate, key, token)
	default:
		return wire.RevokeReport{}, fmt.Errorf("%w: revoke answered %q", wire.ErrInternal, m.Type)
	}
	// The record as the state keeps it (the label and the holder are
	// the state's); the core answers right after applying it, so the
	// record is there unless another revoke of the key came after. The
	// next holder is the one the revoke's own commit granted (the core's
	// reply says: a later grant of the key must not pass for it).
	rep := wire.RevokeReport{Key: key, Token: m.Token, By: by, Reason: reason}
	n.fsm.read(func(st *locksm.State) {
		if rv, ok := st.LastRevoke(key); ok && rv.Token == m.Token {
			rep = *revokeReport(rv)
		}
	})
	rep.NextToken = m.High
	return rep, nil
}
