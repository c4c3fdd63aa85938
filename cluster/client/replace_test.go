package client

import (
	"errors"
	"fmt"
	"testing"

	"ticketing/cluster/wire"
)

// The order planReplace picks, state by state: the replacement rule of
// cluster/members.go, the resumption of half-done runs, and the refusals.
func TestPlanReplaceOrder(t *testing.T) {
	const (
		oldID = "n2/oldoldoldo"
		newID = "n2/newnewnewn"
		addr  = "127.0.0.1:7502"
	)
	type mem struct {
		id      string
		voter   bool
		answers bool
		lag     int64
		found   string
	}
	voter := func(id string, answers bool) mem { return mem{id: id, voter: true, answers: answers} }
	learner := func(id string, answers bool, lag int64) mem { return mem{id: id, answers: answers, lag: lag} }
	deadAt := func(id, found string) mem { return mem{id: id, voter: true, found: found} }
	n1, n3, n4, n5 := voter("n1/aaaaaaaaaa", true), voter("n3/cccccccccc", true), voter("n4/dddddddddd", true), voter("n5/eeeeeeeeee", true)
	dead4, dead5 := voter("n4/dddddddddd", false), voter("n5/eeeeeeeeee", false)
	type want struct {
		op, replaces string // the request
		wait, done   bool
		err          error
	}
	for _, tc := range []struct {
		name  string
		ms    []mem
		acted bool
		want  want
	}{
		{"healthy OLD: the learner first", []mem{n1, voter(oldID, true), n3}, false, want{op: "add-learner"}},
		{"healthy OLD: wait for the learner", []mem{n1, voter(oldID, true), n3, learner(newID, true, 5000)}, true, want{wait: true}},
		{"healthy OLD: a learner that does not answer yet", []mem{n1, voter(oldID, true), n3, learner(newID, false, -1)}, true, want{wait: true}},
		{"healthy OLD: promote and remove in one step", []mem{n1, voter(oldID, true), n3, learner(newID, true, 3)}, true, want{op: "promote", replaces: oldID}},
		{"healthy OLD of five: the 6th voter only inside the step", []mem{n1, voter(oldID, true), n3, n4, n5, learner(newID, true, 0)}, false, want{op: "promote", replaces: oldID}},
		{"healthy OLD, another voter dead: still promote first", []mem{n1, voter(oldID, true), n3, n4, dead5, learner(newID, true, 0)}, false, want{op: "promote", replaces: oldID}},
		{"dead OLD: remove it first", []mem{n1, deadAt(oldID, newID), n3}, false, want{op: "remove"}},
		{"dead OLD, learner already added (the old order): remove it", []mem{n1, voter(oldID, false), n3, learner(newID, true, 0)}, false, want{op: "remove"}},
		{"dead OLD of five with another dead: remove it (tolerance 0 either way)", []mem{n1, voter(oldID, false), n3, n4, dead5}, false, want{op: "remove"}},
		{"OLD gone, 2 voters: add the learner (an earlier run removed OLD)", []mem{n1, n3}, false, want{op: "add-learner"}},
		{"OLD gone, 4 voters: add the learner", []mem{n1, n3, n4, dead5}, false, want{op: "add-learner"}},
		{"OLD gone, caught-up learner: promote", []mem{n1, n3, learner(newID, true, 0)}, false, want{op: "promote"}},
		{"OLD gone after this run removed it, 3 voters (a concurrent run)", []mem{n1, n3, n4}, true, want{op: "add-learner"}},
		{"both voters, 4 voters (a step cut short): remove OLD", []mem{n1, voter(oldID, true), n3, voter(newID, true)}, false, want{op: "remove"}},
		{"done", []mem{n1, n3, voter(newID, true)}, false, want{done: true}},
		{"done, with a learner elsewhere", []mem{n1, n3, voter(newID, true), learner("n9/zzzzzzzzzz", false, -1)}, false, want{done: true}},
		// Refusals.
		{"no majority answers", []mem{n1, voter(oldID, false), voter("n3/cccccccccc", false)}, false, want{err: wire.ErrNoVoterMajority}},
		{"five voters, three silent", []mem{n1, voter(oldID, false), n3, dead4, dead5}, false, want{err: wire.ErrNoVoterMajority}},
		{"OLD not a member, odd voter count", []mem{n1, n3, n4}, false, want{err: wire.ErrNoSuchMember}},
		{"OLD not a member, its name is", []mem{n1, voter("n2/realrealre", true), n3, n4}, false, want{err: wire.ErrNoSuchMember}},
		{"both voters of an odd cluster", []mem{n1, voter(oldID, true), voter(newID, true)}, false, want{err: wire.ErrUnsafeChange}},
		{"OLD is a learner", []mem{n1, n3, n4, learner(oldID, true, 0)}, false, want{err: wire.ErrBadRequest}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ms []wire.AdminMember
			for _, m := range tc.ms {
				name, _ := wire.SplitServerID(m.id)
				peer := fmt.Sprintf("127.0.0.1:%d", 7000+len(ms))
				if m.id == newID || m.id == oldID {
					peer = addr
				}
				lag := m.lag
				if !m.answers {
					lag = -1
				}
				ms = append(ms, wire.AdminMember{ServerID: m.id, Name: name, PeerAddr: peer, Voter: m.voter,
					Answers: m.answers, Lag: lag, FoundAtAddr: m.found})
			}
			step, err := planReplace(ms, oldID, newID, addr, tc.acted)
			if tc.want.err != nil {
				if !errors.Is(err, tc.want.err) {
					t.Fatalf("got %+v, %v; want %v", step, err, tc.want.err)
				}
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if step.done != tc.want.done || step.wait != tc.want.wait || step.req.Op != tc.want.op || step.req.Replaces != tc.want.replaces {
				t.Fatalf("step %+v, want %+v", step, tc.want)
			}
			switch step.req.Op {
			case "remove":
				if step.req.ID != oldID {
					t.Fatalf("removes %s", step.req.ID)
				}
			case "add-learner", "promote":
				if step.req.ID != newID || (step.req.Op == "add-learner" && step.req.Addr != addr) {
					t.Fatalf("step %+v", step.req)
				}
			}
			t.Logf("%s", step.what)
		})
	}
	// A NEW already at another address is refused whatever else holds.
	ms := []wire.AdminMember{{ServerID: newID, Name: "n2", PeerAddr: "127.0.0.1:1", Lag: 0, Answers: true}}
	if _, err := planReplace(ms, oldID, newID, addr, false); !errors.Is(err, wire.ErrBadRequest) {
		t.Fatalf("NEW at another address: %v", err)
	}
}
