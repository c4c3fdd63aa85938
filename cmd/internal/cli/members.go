package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"ticketing/cluster/wire"
)

const membersSynopsis = `ticketing members COMMAND [ARGS] --admin ADDR,ADDR,... --admin-secret-file F [--tls-ca CA] [--cluster-id ID]
       ticketing members COMMAND [ARGS] --config NODE.CONF
       (the flags may come before or after COMMAND and its arguments; $TICKETING_ADMIN, ... stand in for them)`

const membersAbout = `  list                           members: role, whether each answers, lag behind the leader's
                                 commit index, and how many more voter failures the cluster
                                 survives; a wiped node standing at a member's address is shown
                                 with the replace command that repairs it
  add-learner SERVERID PEERADDR  add a new server (NAME/INCARNATION, from its log) as a non-voter
  promote SERVERID               make a caught-up learner a voter (never a 6th voter: use replace;
                                 never one older than the cluster version, or not answering)
  remove SERVERID                take a server out (the leader hands over first if it is SERVERID)
  replace OLD NEW PEERADDR       swap voter OLD for NEW, a node already running at PEERADDR with
                                 an empty data dir, in a safe order (below)

The replacement rule. With v voters of which h answer, the cluster survives h - (v/2 rounded
down + 1) more voter failures. replace never lowers that number on the way:
  - OLD does not answer (dead, or a wiped node stands at its address): remove OLD first, then
    add NEW as a learner, wait until it has caught up (within 64 entries), promote it.
  - OLD answers: add NEW as a learner, wait until it has caught up, then promote NEW and remove
    OLD in one step on the leader: the 4th or 6th voter exists only inside that step. If OLD
    leads, it hands its leadership over first.
replace reads the members before every step, so running it again finishes an interrupted
replacement, and changes nothing once it is done. It adds NEW only once NEW answers (waiting
for it at most 2 minutes), so that its protocol version is checked: a NEW older than the
cluster version is refused (upgrade it first). It refuses when no safe order exists: fewer
than a majority of the voters answer, so nothing can be committed. Then bring back the
voters that still have their data dirs; if a majority lost their data for good, build a new
cluster (docs/operations.md, Runbook: "The majority is lost for good").

remove refuses when the remaining voters would not form a majority of answering nodes, and
when fewer than 3 voters would stay, except that it may leave 2 when the voter removed does
not answer (the cluster then survives as many failures as before: none).`

// listNoLeaderWait is how long members list looks for a leader before it
// says that none leads, and what each address answered.
const listNoLeaderWait = 3 * time.Second

// runMembers is `ticketing members list|add-learner|promote|remove|replace`:
// membership changes through the nodes' admin ports (cluster/admin.go).
func runMembers(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, af := newAdminFlags("ticketing members", membersSynopsis, membersAbout, stdout, stderr, 10*time.Minute,
		"list: print the leader's members reply as JSON")
	pos, err := parseInterspersed(fs.FlagSet, args)
	if code, ok := fs.parsed(err); !ok {
		return code
	}
	want := map[string]int{"list": 0, "add-learner": 2, "promote": 1, "remove": 1, "replace": 3}
	if len(pos) == 0 {
		return fs.bad("want a COMMAND: list, add-learner, promote, remove or replace")
	}
	cmd, arg := pos[0], pos[1:]
	if n, ok := want[cmd]; !ok {
		return fs.bad("unknown command %q", cmd)
	} else if len(arg) != n {
		return fs.bad("%s: want %d arguments, got %d (%q)", cmd, n, len(arg), arg)
	}
	name := "ticketing members " + cmd
	a := af.cluster(name, stderr)
	if a == nil {
		return ExitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, af.timeout)
	defer cancel()
	if cmd == "list" && a.NoLeaderWait == 0 {
		// A read: an election takes a second or two, and an operator
		// looking at a cluster with no leader wants to know it now, with
		// what each address said, rather than 30 s of silence.
		a.NoLeaderWait = listNoLeaderWait
	}
	switch cmd {
	case "list":
		var rep wire.AdminReply
		if rep, err = a.Members(ctx); err == nil {
			if af.json {
				b, _ := json.MarshalIndent(membersJSON(rep), "", "  ")
				_, err = fmt.Fprintln(stdout, string(b))
				break
			}
			out := &errWriter{w: stdout}
			printMembers(out, rep)
			err = out.err
		}
	case "add-learner":
		_, err = a.Do(ctx, wire.AdminRequest{Op: "add-learner", ID: arg[0], Addr: arg[1]})
	case "promote":
		_, err = a.Do(ctx, wire.AdminRequest{Op: "promote", ID: arg[0]})
	case "remove":
		_, err = a.Do(ctx, wire.AdminRequest{Op: "remove", ID: arg[0]})
	case "replace":
		start := time.Now()
		err = a.Replace(ctx, arg[0], arg[1], arg[2], func(s string) {
			fmt.Fprintf(stdout, "%6.1fs  %s\n", time.Since(start).Seconds(), s)
		})
	}
	if err != nil {
		fmt.Fprintln(stderr, name+":", strings.TrimSpace(err.Error())+clusterIDHint(err))
		return ExitError
	}
	if cmd != "list" && cmd != "replace" {
		fmt.Fprintln(stdout, "ok")
	}
	return ExitOK
}

// membersDoc is what `members list --json` prints: the leader's members
// reply with every key in snake_case, as `status --json` writes its keys.
// The admin port's own reply keeps its capitalized member keys (ServerID,
// PeerAddr, ...) for the tools that read it (cluster/wire/PROTOCOL.md);
// until issue 32 (December 2026) --json printed that reply as it was.
type membersDoc struct {
	OK      bool         `json:"ok"`
	Leader  string       `json:"leader,omitempty"`
	Members []memberJSON `json:"members"`
	Commit  uint64       `json:"commit"`
}

type memberJSON struct {
	ServerID    string `json:"server_id"`
	Name        string `json:"name"`
	PeerAddr    string `json:"peer_addr"`
	ClientAddr  string `json:"client_addr"`
	Voter       bool   `json:"voter"`
	Leader      bool   `json:"leader"`
	Lag         int64  `json:"lag"` // -1: it did not answer
	Answers     bool   `json:"answers"`
	FoundAtAddr string `json:"found_at_addr,omitempty"`
}

func membersJSON(rep wire.AdminReply) membersDoc {
	d := membersDoc{OK: rep.OK, Leader: rep.Leader, Commit: rep.Commit, Members: []memberJSON{}}
	for _, m := range rep.Members {
		d.Members = append(d.Members, memberJSON{ServerID: m.ServerID, Name: m.Name, PeerAddr: m.PeerAddr,
			ClientAddr: m.ClientAddr, Voter: m.Voter, Leader: m.Leader, Lag: m.Lag, Answers: m.Answers,
			FoundAtAddr: m.FoundAtAddr})
	}
	return d
}

// parseInterspersed parses args with fs, taking flags before, between and
// after the positional arguments (the flag package stops at the first
// positional one); everything after a "--" is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var tail []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, tail = args[:i], args[i+1:]
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return append(pos, tail...), nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// memberRow is one member as `members list` and `status` print it.
type memberRow struct {
	id, peerAddr  string
	voter, leader bool
	// answers is nil when unknown (the view of a node that does not lead).
	answers *bool
	found   string
}

func (m memberRow) role() string {
	switch {
	case m.leader:
		return "leader"
	case m.voter:
		return "voter"
	}
	return "learner"
}

func (m memberRow) answersCol() string {
	switch {
	case m.answers == nil:
		return "-"
	case *m.answers:
		return "yes"
	}
	return "no"
}

func printMembers(w *errWriter, rep wire.AdminReply) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER ID\tPEER ADDRESS\tROLE\tANSWERS\tLAG")
	var rows []memberRow
	for _, m := range rep.Members {
		answers := m.Answers
		r := memberRow{id: m.ServerID, peerAddr: m.PeerAddr, voter: m.Voter, leader: m.Leader, answers: &answers, found: m.FoundAtAddr}
		rows = append(rows, r)
		lag := "-"
		if m.Lag >= 0 {
			lag = fmt.Sprint(m.Lag)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.ServerID, m.PeerAddr, r.role(), r.answersCol(), lag)
	}
	_ = tw.Flush() // its write error is kept by w
	fmt.Fprintf(w, "commit index %d\n", rep.Commit)
	printHealthNotes(w, rows)
}

// printHealthNotes says how many failures the cluster survives and, for
// each member that does not answer, what stands at its address and the
// command that repairs it.
func printHealthNotes(w io.Writer, rows []memberRow) {
	v, h := 0, 0
	for _, r := range rows {
		if r.answers == nil {
			return
		}
		if r.voter {
			v++
			if *r.answers {
				h++
			}
		}
	}
	// (Worded without "voter" and "leader", the words of the ROLE column.)
	switch f := wire.Tolerance(v, h); {
	case f < 0:
		fmt.Fprintf(w, "%d of %d votes answer (%d needed): no majority, nothing can be committed (docs/operations.md, Runbook)\n", h, v, v/2+1)
	case f == 1:
		fmt.Fprintf(w, "%d of %d votes answer (%d needed): the cluster survives 1 more failure\n", h, v, v/2+1)
	default:
		fmt.Fprintf(w, "%d of %d votes answer (%d needed): the cluster survives %d more failures\n", h, v, v/2+1, f)
	}
	for _, r := range rows {
		switch {
		case *r.answers:
		case r.found != "":
			name, _ := wire.SplitServerID(r.id)
			known := "not a member yet"
			for _, o := range rows {
				if o.id == r.found {
					known = "already a " + o.role() + ": a replacement is half done"
				}
			}
			fmt.Fprintf(w, "%s does not answer: %s stands at its address %s, a new incarnation of %s (its data dir was "+
				"wiped or replaced; %s). Repair with:\n  ticketing members replace %s %s %s\n",
				r.id, r.found, r.peerAddr, name, known, r.id, r.found, r.peerAddr)
		case r.voter:
			fmt.Fprintf(w, "%s does not answer at %s. If it is lost for good, start a replacement with an empty "+
				"data dir and run: ticketing members replace %s NEW PEERADDR\n", r.id, r.peerAddr, r.id)
		default:
			fmt.Fprintf(w, "%s (a learner) does not answer at %s\n", r.id, r.peerAddr)
		}
	}
}
