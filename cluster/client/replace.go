package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"ticketing/cluster/wire"
)

// Replace is the client side of the replacement rule (cluster/members.go): it
// reads the members with their health from the leader before every step
// and takes the next step that keeps the failures the cluster survives, so
// a run that was cut short (a leader change, a lost connection, an earlier
// call that gave up) is finished by running it again.

// replaceStep is what Replace does next, from one read of the members.
type replaceStep struct {
	done bool
	// wait: nothing to ask yet (the learner is catching up or does not
	// answer); read the members again shortly.
	wait bool
	req  wire.AdminRequest
	// what says what the step does, and why, for progress messages.
	what string
}

// planReplace picks the next step of replacing oldID by newID (at
// peerAddr) from the leader's members reply ms. acted says whether this
// Replace run has already asked for a change. Before it has, a state that
// is not one a replacement passes through is refused instead of being
// taken for a half-done earlier one: OLD gone while another member carries
// its node name or the voter count is odd (a mistyped OLD would otherwise
// grow the cluster), or OLD and NEW both voting in an odd-sized cluster.
func planReplace(ms []wire.AdminMember, oldID, newID, peerAddr string, acted bool) (replaceStep, error) {
	var old, nw *wire.AdminMember
	v, h := 0, 0
	var silent []string
	for i := range ms {
		m := &ms[i]
		switch m.ServerID {
		case oldID:
			old = m
		case newID:
			nw = m
		}
		if m.Voter {
			v++
			if m.Answers {
				h++
			} else {
				silent = append(silent, m.ServerID)
			}
		}
	}
	if nw != nil && nw.PeerAddr != peerAddr {
		return replaceStep{}, fmt.Errorf("%w: %s is already a member at %s, not %s", wire.ErrBadRequest, newID, nw.PeerAddr, peerAddr)
	}
	if old == nil && nw != nil && nw.Voter {
		return replaceStep{done: true, what: fmt.Sprintf("%s is a voter and %s is gone (%d voters, %d answer)", newID, oldID, v, h)}, nil
	}
	if wire.Tolerance(v, h) < 0 {
		return replaceStep{}, fmt.Errorf("%w: %w: only %d of the %d voters answer (not answering: %s); nothing can be "+
			"committed, so no order of changes can replace %s: bring back the voters that still have their data dirs "+
			"(they rejoin as they were), then run this again; if a majority lost their data for good, build a new "+
			"cluster (docs/operations.md, Runbook: \"The majority is lost for good\")",
			wire.ErrUnsafeChange, wire.ErrNoVoterMajority, h, v, strings.Join(silent, ", "), oldID)
	}
	oldName, _ := wire.SplitServerID(oldID)
	namesake := ""
	for _, m := range ms {
		if m.Name == oldName && m.ServerID != newID {
			namesake = m.ServerID
		}
	}
	promote := func(req wire.AdminRequest, what string) replaceStep {
		switch {
		case !nw.Answers:
			return replaceStep{wait: true, what: fmt.Sprintf("%s does not answer at %s yet (is it running, with an empty data dir?)", newID, peerAddr)}
		case nw.Lag > wire.MaxPromoteLag:
			return replaceStep{wait: true, what: fmt.Sprintf("%s is catching up: %d entries behind the commit index", newID, nw.Lag)}
		}
		return replaceStep{req: req, what: what}
	}
	// Answering: the leader adds NEW only once it answers, so that its
	// protocol version is checked (a node older than the cluster version
	// is refused); until then Replace waits, as for a learner that does
	// not answer.
	addLearner := replaceStep{req: wire.AdminRequest{Op: wire.AdminOpAddLearner, ID: newID, Addr: peerAddr, Answering: true},
		what: fmt.Sprintf("add %s at %s as a learner", newID, peerAddr)}
	if old == nil {
		if !acted && namesake != "" {
			return replaceStep{}, fmt.Errorf("%w: %s is not a member, but %s is: did you mean it?", wire.ErrNoSuchMember, oldID, namesake)
		}
		if nw == nil {
			if !acted && v%2 == 1 {
				return replaceStep{}, fmt.Errorf("%w: %s is not a member and the cluster has %d voters (no replacement is half "+
					"done); to grow the cluster, use `members add-learner` and `members promote`", wire.ErrNoSuchMember, oldID, v)
			}
			return addLearner, nil
		}
		return promote(wire.AdminRequest{Op: wire.AdminOpPromote, ID: newID}, fmt.Sprintf("promote %s (%s is gone)", newID, oldID)), nil
	}
	if !old.Voter {
		return replaceStep{}, fmt.Errorf("%w: %s is a learner, not a voter: `members remove %s`, then `members add-learner %s %s`",
			wire.ErrBadRequest, oldID, oldID, newID, peerAddr)
	}
	if nw != nil && nw.Voter {
		if !acted && v%2 == 1 {
			return replaceStep{}, fmt.Errorf("%w: %s and %s are both voters of %d: nothing to replace (`members remove %s` shrinks the cluster)",
				wire.ErrUnsafeChange, oldID, newID, v, oldID)
		}
		return replaceStep{req: wire.AdminRequest{Op: wire.AdminOpRemove, ID: oldID},
			what: fmt.Sprintf("remove %s (%s already votes)", oldID, newID)}, nil
	}
	if !old.Answers {
		why := "it does not answer"
		if old.FoundAtAddr != "" {
			why = fmt.Sprintf("it does not answer; %s stands at its address", old.FoundAtAddr)
		}
		return replaceStep{req: wire.AdminRequest{Op: wire.AdminOpRemove, ID: oldID},
			what: fmt.Sprintf("remove %s first (%s; %d voters, %d answer: the cluster survives %d more failures with or without it)",
				oldID, why, v, h, wire.Tolerance(v, h))}, nil
	}
	if nw == nil {
		return addLearner, nil
	}
	return promote(wire.AdminRequest{Op: wire.AdminOpPromote, ID: newID, Replaces: oldID},
		fmt.Sprintf("promote %s and remove %s in one step (%s answers)", newID, oldID, oldID)), nil
}

// Replace swaps server oldID for newID, a node running at peerAddr with
// an empty data dir, in the order of the replacement rule
// (cluster/members.go): if oldID does not answer, remove it, add newID as a
// learner, wait until it has caught up, promote it; if oldID answers, add
// newID as a learner, wait, then promote it and remove oldID in one step
// (the leader hands over first if it is oldID). Before every step it reads
// the members and their health from the leader, so it picks up where an
// earlier run or a leader change left off, and running it again after it
// succeeded changes nothing. newID is added only once it answers the
// leader (so that the leader checks its protocol version: one older than
// the cluster version is refused), and Replace waits for it to answer,
// before it is added and while it catches up, for at most NewNodeWait in
// a row. It retries through elections, lost
// connections, a change already in progress and (up to 10 times in a row)
// a change Raft failed without a reason code; it refuses, with a reason,
// only when no safe order exists (wire.ErrNoVoterMajority, which is
// cluster.ErrNoQuorum: a majority of the voters do not answer; or a
// request that names the wrong members), when newID is refused
// (wire.ErrUnsafeChange: older than the cluster version), or when newID
// does not answer for NewNodeWait (wire.ErrLearnerLagging). progress, if
// not nil, hears each step.
func (a *AdminCluster) Replace(ctx context.Context, oldID, newID, peerAddr string, progress func(string)) error {
	say := func(format string, args ...any) {
		if progress != nil {
			progress(fmt.Sprintf(format, args...))
		}
	}
	if oldID == newID {
		return fmt.Errorf("%w: replacing %s by itself", wire.ErrBadRequest, oldID)
	}
	pause := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	newWait := a.NewNodeWait
	if newWait <= 0 {
		newWait = DefaultNewNodeWait
	}
	// silentSince is when newID was first seen not answering, since it
	// last answered (zero: it answers, or has not been asked about yet).
	var silentSince time.Time
	silent := func() error {
		if silentSince.IsZero() {
			silentSince = time.Now()
		}
		if time.Since(silentSince) < newWait {
			return nil
		}
		return fmt.Errorf("%w: %s did not answer the leader over its peer port at %s for %v, so its protocol version "+
			"could not be checked and it was not made a voter: start it there, with an empty data dir and without "+
			"--peers, then run this again", wire.ErrLearnerLagging, newID, peerAddr, newWait)
	}
	var (
		acted      bool   // a change was asked for (it may have been applied)
		refused    string // the step refused last, and how often in a row
		refusals   int
		planErrs   int
		internal   int // failed changes in a row without a reason code
		lastWaited string
	)
	for {
		rep, err := a.Members(ctx)
		if err != nil {
			return err
		}
		step, err := planReplace(rep.Members, oldID, newID, peerAddr, acted)
		if err != nil {
			// The health behind a refusal comes from probes with a
			// deadline; on a busy machine one may miss. Look twice.
			if planErrs++; planErrs >= 2 {
				return err
			}
			say("%v; checking again", err)
			if err := pause(time.Second); err != nil {
				return err
			}
			continue
		}
		planErrs = 0
		if step.done {
			say("done: %s", step.what)
			return nil
		}
		if nw := findAdminMember(rep.Members, newID); nw != nil && nw.Answers {
			silentSince = time.Time{}
		}
		if step.wait {
			if nw := findAdminMember(rep.Members, newID); nw != nil && !nw.Answers {
				if err := silent(); err != nil {
					return err
				}
			}
			if step.what != lastWaited {
				say("waiting: %s", step.what)
				lastWaited = step.what
			}
			if err := pause(300 * time.Millisecond); err != nil {
				return fmt.Errorf("%s: %w", step.what, err)
			}
			continue
		}
		acted = true
		_, err = a.Do(ctx, step.req)
		switch {
		case err == nil:
			lastWaited, silentSince = "", time.Time{}
			say("%s: done", step.what)
			refused, refusals, internal = "", 0, 0
			continue // the next read confirms it
		case ctx.Err() != nil:
			return fmt.Errorf("%s: %w", step.what, err)
		case errors.Is(err, wire.ErrChangeInProgress), errors.Is(err, wire.ErrNotLeader), !errors.Is(err, ErrAdmin):
			say("%s: %v; retrying", step.what, err)
		case errors.Is(err, wire.ErrLearnerLagging) && step.req.Op == wire.AdminOpAddLearner:
			// NEW does not answer yet (Answering): wait for it, as for
			// a learner that does not answer, saying so once.
			if err := silent(); err != nil {
				return err
			}
			if what := fmt.Sprintf("%s does not answer at %s yet (is it running, with an empty data dir?)", newID, peerAddr); what != lastWaited {
				say("waiting: %s", what)
				lastWaited = what
			}
			if err := pause(300 * time.Millisecond); err != nil {
				return fmt.Errorf("%s: %w", step.what, err)
			}
			continue
		case errors.Is(err, wire.ErrLearnerLagging):
			say("%s: %v; waiting", step.what, err)
		case errors.Is(err, wire.ErrUnsafeChange), errors.Is(err, wire.ErrNoVoterMajority), errors.Is(err, wire.ErrNoSuchMember):
			// The leader's own look at the health differed from the one
			// the step was chosen by: read again, and give up only when
			// the same step is refused twice in a row.
			if key := fmt.Sprint(step.req); key == refused {
				refusals++
			} else {
				refused, refusals = key, 1
			}
			if refusals >= 2 {
				return fmt.Errorf("%s: %w", step.what, err)
			}
			say("%s: %v; reading the members again", step.what, err)
		case errors.Is(err, wire.ErrBadRequest):
			return fmt.Errorf("%s: %w", step.what, err)
		default:
			// "internal": Raft failed the change (a timeout, a hand-over
			// that did not finish); the next read shows what happened.
			if internal++; internal >= 10 {
				return fmt.Errorf("%s: %w", step.what, err)
			}
			say("%s: %v; retrying", step.what, err)
		}
		if err := pause(500 * time.Millisecond); err != nil {
			return fmt.Errorf("%s: %w", step.what, err)
		}
	}
}

// Members asks for the leader's members reply (op "members": each member
// with its health) until a leader answers, through elections and
// unreachable nodes, for at most NoLeaderWait; then it fails with
// wire.ErrNoVoterMajority, saying what each address answered.
func (a *AdminCluster) Members(ctx context.Context) (wire.AdminReply, error) {
	wait := a.NoLeaderWait
	if wait <= 0 {
		wait = DefaultNoLeaderWait
	}
	deadline := time.Now().Add(wait)
	for {
		var seen []string
		for _, addr := range a.Addrs {
			actx, cancel := context.WithTimeout(ctx, adminReadWait)
			rep, err := AdminDo(actx, addr, a.Config, wire.AdminRequest{Op: wire.AdminOpMembers})
			cancel()
			switch {
			case err == nil:
				return rep, nil
			case errors.Is(err, wire.ErrNotLeader):
				knows := "no leader"
				if rep.Leader != "" {
					knows = "leader " + rep.Leader
				}
				seen = append(seen, fmt.Sprintf("%s: not the leader (knows %s)", addr, knows))
			case errors.Is(err, ErrAdmin):
				return rep, err
			default:
				seen = append(seen, fmt.Sprintf("%s: %v", addr, err))
			}
			if ctx.Err() != nil {
				return wire.AdminReply{}, fmt.Errorf("%w (%s)", ctx.Err(), strings.Join(seen, "; "))
			}
		}
		if len(a.Addrs) == 0 {
			return wire.AdminReply{}, fmt.Errorf("%w: no admin address", wire.ErrBadRequest)
		}
		if time.Now().After(deadline) {
			return wire.AdminReply{}, fmt.Errorf("%w: no node led for %v (%s): a leader needs a majority of the voters "+
				"answering each other. If a majority is down, nothing can be committed and no membership change can "+
				"help: bring back the voters that still have their data dirs, then run this again; if a majority lost "+
				"their data for good, build a new cluster (docs/operations.md, Runbook: \"The majority is lost for good\")",
				wire.ErrNoVoterMajority, wait, strings.Join(seen, "; "))
		}
		select {
		case <-ctx.Done():
			return wire.AdminReply{}, fmt.Errorf("%w (%s)", ctx.Err(), strings.Join(seen, "; "))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// findAdminMember finds id in a members reply (nil if absent).
func findAdminMember(ms []wire.AdminMember, id string) *wire.AdminMember {
	for i := range ms {
		if ms[i].ServerID == id {
			return &ms[i]
		}
	}
	return nil
}
