package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/tlsconf"
	"ticketing/cluster/wire"
)

// runStatus is `ticketing status`: the cluster as one node sees it (the
// leader when one answers), through the admin port ("status" op).
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, af := newAdminFlagSet("ticketing status", "ticketing status [--admin ADDR,ADDR,... --admin-secret-file F [--tls-ca CA] [--cluster-id ID] | --config NODE.CONF] [--json]",
		`Leader, term, commit index, fencing domain, keys held, waiters, the token
high-water mark, and every member with its role, whether it answers the
leader over the peer port, and its lag behind the leader's commit index; how
many more voter failures the cluster survives; for a member that does not
answer, what stands at its address and the command that repairs it. The
leader answers when one of the addresses is the leader; otherwise the first
node that answers does (health and lag are then unknown).`, stdout, stderr)
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		return fs.bad("want no arguments, got %q", fs.Args())
	}
	return af.run(ctx, "ticketing status", wire.AdminRequest{Op: "status"}, stdout, stderr)
}

// runInspect is `ticketing inspect KEY`: one key's holder and queue.
func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, af := newAdminFlagSet("ticketing inspect", "ticketing inspect [flags] KEY    (or: ticketing inspect KEY [flags])",
		`The holder of KEY (owner, token, lease, when it was last extended, how long
it has held it, how much lease is left and when it ends) and its queue, head first (owners, how long each has waited and
how much of its wait is left). Asked of the leader, whose timers give the
remaining times; from another node they are estimates from the leader's
time stamps and that node's clock.`, stdout, stderr)
	key, code, ok := parseKeyArg(fs, args, "inspect")
	if !ok {
		return code
	}
	return af.run(ctx, "ticketing inspect", wire.AdminRequest{Op: "inspect", Key: key}, stdout, stderr)
}

// parseKeyArg parses the flags of a command that takes one KEY, before
// or after its flags, and checks the key before anything is dialled; ok
// false with the exit code when the invocation is bad (what: the verb,
// for "want the KEY to inspect").
func parseKeyArg(fs *cmdFlags, args []string, what string) (key string, code int, ok bool) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		key, args = args[0], args[1:]
	}
	if code, ok := fs.parse(args); !ok {
		return "", code, false
	}
	switch {
	case key == "" && fs.NArg() == 1:
		key = fs.Arg(0)
	case key != "" && fs.NArg() == 0:
	case key == "" && fs.NArg() == 0:
		return "", fs.bad("want the KEY to %s", what), false
	default:
		got := fs.Args()
		if key != "" {
			got = append([]string{key}, got...)
		}
		return "", fs.bad("want one KEY, got %q", got), false
	}
	if why := badKey(key); why != "" {
		return "", fs.bad("%s", why), false
	}
	return key, 0, true
}

// adminFlags are the flags of the read-only admin commands (the same as
// `ticketing members`, plus --json).
type adminFlags struct {
	addrs, secretFile, clusterID string
	config                       string // a node's configuration file (adminconn.go)
	timeout                      time.Duration
	tf                           tlsFlags
	json                         bool
	fs                           *flag.FlagSet
}

func newAdminFlagSet(name, synopsis, about string, stdout, stderr io.Writer) (*cmdFlags, *adminFlags) {
	return newAdminFlags(name, synopsis, about, stdout, stderr, 20*time.Second, "print the node's report as JSON")
}

// newAdminFlags is the flag set of the admin commands, with the default
// of --timeout and the meaning of --json.
func newAdminFlags(name, synopsis, about string, stdout, stderr io.Writer, timeout time.Duration, jsonUsage string) (*cmdFlags, *adminFlags) {
	fl := newCmdFlags(name, synopsis, about, stdout, stderr)
	fs := fl.FlagSet
	af := &adminFlags{fs: fs}
	fs.StringVar(&af.addrs, "admin", "", "the nodes' admin addresses, comma separated (the leader is found among them; default $TICKETING_ADMIN)")
	fs.StringVar(&af.secretFile, "admin-secret-file", "", "file holding the admin secret (default $TICKETING_ADMIN_SECRET_FILE)")
	fs.StringVar(&af.clusterID, "cluster-id", "", "the nodes' --cluster-id, cluster-id in their configuration file (default $TICKETING_CLUSTER_ID)")
	fs.StringVar(&af.config, "config", "", "a node's own configuration `FILE` (ticketing node --config): --admin, --admin-secret-file, "+
		"--tls-ca and --cluster-id not given as flags or in the environment come from it (its admin-addr, and its peers' hosts at that port)")
	fs.DurationVar(&af.timeout, "timeout", timeout, "give up after this long")
	fs.BoolVar(&af.json, "json", false, jsonUsage)
	af.tf.register(fs, false)
	if f := fs.Lookup("tls-ca"); f != nil {
		f.Usage += " (default $TICKETING_TLS_CA)"
	}
	fl.after = adminConnHelp
	return fl, af
}

// adminConnHelp is the end of the operator commands' -h.
const adminConnHelp = `The connection: --admin, --admin-secret-file, --tls-ca and --cluster-id,
else $TICKETING_ADMIN, $TICKETING_ADMIN_SECRET_FILE, $TICKETING_TLS_CA and
$TICKETING_CLUSTER_ID, else what --config derives from a node's own file
(flags win over the environment, the environment over the file). ticketing
dev prints the export line for its cluster.`

// cluster builds the admin client from the flags; on a bad flag it says
// why on stderr and returns nil.
func (af *adminFlags) cluster(name string, stderr io.Writer) *client.AdminCluster {
	if err := af.resolve(af.fs, os.LookupEnv); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return nil
	}
	a := &client.AdminCluster{Addrs: splitList(af.addrs)}
	if len(a.Addrs) == 0 || af.secretFile == "" {
		fmt.Fprintln(stderr, name+": --admin and --admin-secret-file are required (or $TICKETING_ADMIN and "+
			"$TICKETING_ADMIN_SECRET_FILE, or --config with a node's configuration file)")
		return nil
	}
	var err error
	if a.Config.Secret, err = cluster.ReadSecretFile(af.secretFile); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return nil
	}
	a.Config.ClusterID = af.clusterID
	if err := af.tf.plaintextAllowed(a.Addrs...); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return nil
	}
	if af.tf.files.Enabled() {
		if a.Config.TLS, err = tlsconf.ClientConfig(af.tf.files); err != nil {
			fmt.Fprintln(stderr, name+":", err)
			return nil
		}
		a.Config.TLS.ServerName = af.tf.serverName
	}
	return a
}

// perNodeWait bounds one node's answer (a leader's status asks every
// member for its lag, for up to 3 s).
const perNodeWait = 8 * time.Second

// run sends req (leader first) and prints the reply.
func (af *adminFlags) run(ctx context.Context, name string, req wire.AdminRequest, stdout, stderr io.Writer) int {
	a := af.cluster(name, stderr)
	if a == nil {
		return ExitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, af.timeout)
	defer cancel()
	rep, fromLeader, err := askLeaderFirst(ctx, a, req)
	if err != nil {
		fmt.Fprintln(stderr, name+":", strings.TrimSpace(err.Error())+clusterIDHint(err))
		return ExitError
	}
	if !fromLeader {
		who := "?"
		if rep.Status != nil {
			who = rep.Status.ServerID + " (" + rep.Status.Role + ")"
		} else if rep.Key != nil {
			who = rep.Key.ServerID + " (" + rep.Key.Role + ")"
		}
		fmt.Fprintf(stderr, "%s: no leader among the addresses answered; this is the view of %s\n", name, who)
	}
	if af.json {
		var v any = rep.Status
		if req.Op == "inspect" {
			v = rep.Key
		}
		b, _ := json.MarshalIndent(v, "", "  ")
		if _, err := fmt.Fprintln(stdout, string(b)); err != nil {
			fmt.Fprintf(stderr, "%s: writing the report: %v\n", name, err)
			return ExitError
		}
		return ExitOK
	}
	out := &errWriter{w: stdout}
	switch {
	case rep.Status != nil:
		printStatus(out, rep.Status)
		printSessions(out, rep.Status)
	case rep.Key != nil:
		printKey(out, rep.Key)
	default:
		fmt.Fprintln(stderr, name+": the node sent an empty report (is it an older version?)")
		return ExitError
	}
	if out.err != nil {
		fmt.Fprintf(stderr, "%s: writing the report: %v\n", name, out.err)
		return ExitError
	}
	return ExitOK
}

// askLeaderFirst asks each address for req as leader-only (so the leader
// answers); if none leads or answers, it asks again without that, and the
// first node that answers gives its own view (fromLeader false).
func askLeaderFirst(ctx context.Context, a *client.AdminCluster, req wire.AdminRequest) (rep wire.AdminReply, fromLeader bool, err error) {
	var errs []error
	unreachable := map[string]bool{}
	for _, leaderOnly := range []bool{true, false} {
		req.LeaderOnly = leaderOnly
		for _, addr := range a.Addrs {
			if unreachable[addr] {
				continue // no use asking again
			}
			actx, cancel := context.WithTimeout(ctx, perNodeWait)
			rep, err := client.AdminDo(actx, addr, a.Config, req)
			cancel()
			switch {
			case err == nil:
				return rep, leaderOnly, nil
			case errors.Is(err, wire.ErrNotLeader):
				continue // reachable: asked again in the second round
			case errors.Is(err, client.ErrAdmin):
				return rep, false, err // a refusal (bad key, unknown op): the same everywhere
			case ctx.Err() != nil:
				return rep, false, fmt.Errorf("%s: %w", addr, err)
			}
			unreachable[addr] = true
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		}
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("no node answered"))
	}
	return wire.AdminReply{}, false, errors.Join(errs...)
}

func printStatus(w *errWriter, s *wire.StatusReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	answered := s.Role
	if s.Serving {
		answered += ", serving"
	}
	fmt.Fprintf(tw, "Answered by:\t%s (%s)\n", s.ServerID, answered)
	leader := "none known"
	if s.Leader != "" {
		leader = s.Leader
		if s.LeaderClientAddr != "" {
			leader += " at " + s.LeaderClientAddr
		}
	}
	fmt.Fprintf(tw, "Leader:\t%s\n", leader)
	fmt.Fprintf(tw, "Cluster:\t%s, domain %s, term %d\n", s.ClusterID, orDash(s.Domain), s.Term)
	fmt.Fprintf(tw, "Raft index:\tcommit %d, applied %d\n", s.CommitIndex, s.AppliedIndex)
	keys := "keys"
	if s.KeysHeld == 1 {
		keys = "key"
	}
	fmt.Fprintf(tw, "Locks:\t%d %s held, %d waiting, last token %d\n", s.KeysHeld, keys, s.Waiters, s.LastToken)
	fmt.Fprintf(tw, "Sessions:\t%s\n", sessionsLine(s))
	_ = tw.Flush() // its write error is kept by w
	fmt.Fprintln(w)
	if s.MembersError != "" {
		fmt.Fprintln(w, "members unknown:", s.MembersError)
		return
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER ID\tROLE\tPEER ADDRESS\tCLIENT ADDRESS\tANSWERS\tLAG")
	var rows []memberRow
	for _, m := range s.Members {
		r := memberRow{id: m.ServerID, peerAddr: m.PeerAddr, voter: m.Voter, leader: m.Leader, answers: m.Answers, found: m.FoundAtAddr}
		rows = append(rows, r)
		lag := "-"
		if m.Lag != nil {
			lag = fmt.Sprint(*m.Lag)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.ServerID, r.role(), m.PeerAddr, orDash(m.ClientAddr), r.answersCol(), lag)
	}
	_ = tw.Flush() // its write error is kept by w
	if s.Role != "leader" {
		fmt.Fprintln(w, "(whether members answer, and their lag, are known only to the leader)")
		return
	}
	printHealthNotes(w, rows)
}

// sessionsLine sums up the sidecars' sessions: how many, and in the
// leader's view how many have a connection attached.
func sessionsLine(s *wire.StatusReport) string {
	line := fmt.Sprint(s.SessionsTotal)
	attached, known := 0, false
	for _, ss := range s.Sessions {
		if ss.Attached != nil {
			known = true
			if *ss.Attached {
				attached++
			}
		}
	}
	if known {
		line += fmt.Sprintf(" (%d attached", attached)
		if s.SessionsTruncated {
			line += fmt.Sprintf(" of the first %d", len(s.Sessions))
		}
		line += ")"
	}
	return line
}

// printSessions lists the sidecars' sessions (the id is the one the
// sidecar's INFO shows as session=).
func printSessions(w *errWriter, s *wire.StatusReport) {
	if len(s.Sessions) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tATTACHED\tTIMEOUT\tRESUMES\tWAITING\tHOLDING\tUNACKED")
	for _, ss := range s.Sessions {
		attached := "-"
		switch {
		case ss.Attached == nil:
		case *ss.Attached:
			attached = "yes"
		case ss.Expiring:
			attached = "no, expiring"
		case ss.ExpiresInMs != nil:
			attached = "no, expires in " + fmtMs(*ss.ExpiresInMs)
		default:
			attached = "no"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", ss.ID, attached, fmtMs(int64(ss.TimeoutMs)), ss.Resumes, ss.Waiters, ss.Holdings, ss.Outcomes)
	}
	_ = tw.Flush() // its write error is kept by w
	if s.SessionsTruncated {
		fmt.Fprintf(w, "(first %d of %d sessions shown)\n", len(s.Sessions), s.SessionsTotal)
	}
	if s.Role != "leader" {
		fmt.Fprintln(w, "(whether a session is attached is known only to the leader)")
	}
}

func printKey(w *errWriter, k *wire.KeyReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Key:\t%s\n", k.Key)
	fmt.Fprintf(tw, "Answered by:\t%s (%s)\n", k.ServerID, k.Role)
	switch h := k.Holder; {
	case k.Held && h != nil:
		session := ""
		if h.Session != "" {
			session = ", session " + h.Session
		}
		fmt.Fprintf(tw, "Holder:\t%s, token %d%s\n", h.Owner, h.Token, session)
		if h.Label != "" {
			fmt.Fprintf(tw, "Label:\t%s\n", h.Label)
		}
		if len(h.BlockKeys) > 0 {
			fmt.Fprintf(tw, "Block:\t%d keys under this token: %s\n", len(h.BlockKeys), strings.Join(h.BlockKeys, " "))
		}
		renewed := ""
		if h.RenewedAtUnixMs != 0 {
			renewed = fmt.Sprintf(", renewed %s ago", fmtMs(max(0, k.AtUnixMs-h.RenewedAtUnixMs)))
		}
		fmt.Fprintf(tw, "Lease:\t%ds%s, held %s, %s left%s\n", h.LeaseSec, renewed, fmtMs(h.HeldMs), fmtMs(h.LeaseRemainingMs), fromNote(h.LeaseFrom))
		fmt.Fprintf(tw, "Lease ends:\t%s\n", time.UnixMilli(h.LeaseEndsAtUnixMs).UTC().Format("2006-01-02 15:04:05.000 MST"))
	case k.Reserved:
		fmt.Fprintf(tw, "Holder:\tnone (reserved: the first waiter is a block waiting for its other keys)\n")
	case k.Semaphore != nil:
		fmt.Fprintf(tw, "Semaphore:\t%d permits, %d held\n", k.Semaphore.Permits, k.Semaphore.Held)
	default:
		fmt.Fprintf(tw, "Holder:\tnone (not held)\n")
	}
	queue := fmt.Sprintf("%d waiting", k.QueueLen)
	if len(k.Queue) < k.QueueLen {
		queue += fmt.Sprintf(" (first %d shown)", len(k.Queue))
	}
	fmt.Fprintf(tw, "Queue:\t%s\n", queue)
	if rv := k.LastRevoke; rv != nil {
		fmt.Fprintf(tw, "Last revoke:\t%s\n", describeRevoke(rv, k.AtUnixMs))
	}
	_ = tw.Flush() // its write error is kept by w
	printPermits(w, k)
	if len(k.Queue) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// The LABEL column only when a waiter has one: output without labels
	// stays as it was.
	labels := slices.ContainsFunc(k.Queue, func(q wire.WaiterReport) bool { return q.Label != "" })
	if labels {
		fmt.Fprintln(tw, "#\tOWNER\tLABEL\tWAITED\tWAIT LEFT\tLEASE\tSESSION\tBLOCK")
	} else {
		fmt.Fprintln(tw, "#\tOWNER\tWAITED\tWAIT LEFT\tLEASE\tSESSION\tBLOCK")
	}
	estimated := false
	for i, q := range k.Queue {
		left := fmtMs(q.WaitRemainingMs)
		if q.WaitFrom != wire.FromLeaderTimer {
			left, estimated = "~"+left, true
		}
		block := "-"
		if len(q.BlockKeys) > 0 {
			block = strings.Join(q.BlockKeys, " ")
		}
		owner := q.Owner
		if labels {
			owner += "\t" + orDash(q.Label)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%ds\t%s\t%s\n", i+1, owner, fmtMs(q.WaitedMs), left, q.LeaseSec, orDash(q.Session), block)
	}
	_ = tw.Flush() // its write error is kept by w
	if estimated {
		fmt.Fprintln(w, "(~: estimated from the leader's time stamps and this node's clock)")
	}
}

// printPermits lists a semaphore's held permits, slot order.
func printPermits(w *errWriter, k *wire.KeyReport) {
	if len(k.Permits) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tOWNER\tLABEL\tTOKEN\tHELD\tLEASE LEFT\tSESSION")
	estimated := false
	for _, p := range k.Permits {
		left := fmtMs(p.LeaseRemainingMs)
		if p.LeaseFrom != wire.FromLeaderTimer {
			left, estimated = "~"+left, true
		}
		var slot uint32
		if p.Slot != nil {
			slot = *p.Slot
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", slot, p.Owner, orDash(p.Label), p.Token, fmtMs(p.HeldMs), left, orDash(p.Session))
	}
	_ = tw.Flush() // its write error is kept by w
	if k.PermitsTruncated {
		fmt.Fprintf(w, "(first %d of %d permits shown)\n", len(k.Permits), k.Semaphore.Held)
	}
	if estimated {
		fmt.Fprintln(w, "(~: estimated from the leader's time stamps and this node's clock)")
	}
}

// fromNote says where a remaining time comes from.
func fromNote(from string) string {
	if from == wire.FromLeaderTimer {
		return " (leader's timer)"
	}
	return " (estimate from the leader's time stamp and this node's clock)"
}

// fmtMs prints milliseconds as a short duration: 850ms, 12.3s, 2m5.1s.
func fmtMs(ms int64) string {
	if ms < 1000 {
		return fmt.Sprintf("%dms", ms)
	}
	return (time.Duration(ms) * time.Millisecond).Round(100 * time.Millisecond).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// clusterIDHint is added to an error that is a node's refusal of the
// cluster id: the fix is --cluster-id as in the nodes' configuration.
func clusterIDHint(err error) string {
	if errors.Is(err, wire.ErrWrongCluster) {
		return "\n(give --cluster-id with the id the nodes were started with: cluster-id in their configuration file)"
	}
	return ""
}

// describeRevoke is one line about a revoke: what it ended, who, why and
// how long before at (Unix ms; 0: no age).
func describeRevoke(rv *wire.RevokeReport, at int64) string {
	what := fmt.Sprintf("token %d of %s", rv.Token, rv.Owner)
	if rv.Permit {
		what = fmt.Sprintf("permit %d (token %d) of %s", rv.Slot, rv.Token, rv.Owner)
	}
	if rv.Label != "" {
		what += " (" + rv.Label + ")"
	}
	when := time.UnixMilli(rv.AtUnixMs).UTC().Format("2006-01-02 15:04:05 MST")
	if at > 0 {
		when += ", " + fmtMs(max(0, at-rv.AtUnixMs)) + " ago"
	}
	reason := rv.Reason
	if reason == "" {
		reason = "(no reason given)"
	}
	return fmt.Sprintf("%s by %s at %s: %s", what, rv.By, when, reason)
}
