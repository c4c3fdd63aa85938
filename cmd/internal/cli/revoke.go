package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// runRevoke is `ticketing revoke KEY --reason R [--token T]`: an
// operator ends a stuck holding through the admin port. Without --token
// it reads the holder's token from the leader first and revokes exactly
// that holding, so a holder that changed in between is never hit.
func runRevoke(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const name = "ticketing revoke"
	fs, af := newAdminFlags(name, `ticketing revoke [flags] KEY --reason "WHY"    (or: ticketing revoke KEY [flags])`,
		`Ends the holding of KEY on an operator's word, through the Raft log like
a release: the next waiter is granted with a larger token in the same
commit, the holder's sidecar tells its caller "! LOST <token> revoked" with
who and why, the leader logs the revoke ("lock revoked") and counts it
(ticketing_node_revokes_total), and "ticketing inspect KEY" shows it as
the key's last revoke. The revoked holder's fenced writes are refused from
then on (its token is older than the next holder's).

Without --token, the holder's token is read from the leader first and the
revoke names exactly it: if the key changed hands in between, nothing is
revoked (exit 1). A permit of a semaphore, or a block named by any of its
keys, is revoked by its token (inspect lists them).

Exit status: 0 revoked (or found revoked already: "Already revoked", the
key's last revoke names that token); 1 refused or failed, nothing revoked
(not held, held under another token, the cluster not at version 14 yet,
no leader);
2 bad flags or arguments; 77 the outcome is unknown (the leadership changed
before it applied): run "ticketing inspect KEY", whose last revoke says.`, stdout, stderr, 70*time.Second,
		"print the revoke's record as JSON")
	var token uint64
	var reason, by string
	fs.Uint64Var(&token, "token", 0, "the token of the holding to end (default: the current holder's, read from the leader)")
	fs.StringVar(&reason, "reason", "", "why (required; up to 128 bytes of printable ASCII): kept in the audit record and told to the holder")
	fs.StringVar(&by, "by", "", "who revokes, for the audit record (default USER@HOSTNAME)")
	key, code, ok := parseKeyArg(fs, args, "revoke")
	if !ok {
		return code
	}
	reason = strings.TrimSpace(reason)
	if reason == "" {
		return fs.bad("want --reason: say why, for the audit record and the holder")
	}
	if locksm.ValidateReason(reason) != nil {
		return fs.bad("--reason: want at most %d bytes of printable ASCII, got %d bytes", locksm.MaxReasonLen, len(reason))
	}
	if by == "" {
		by = operatorName()
	}
	if locksm.ValidateOwner(by) != nil {
		return fs.bad("--by %q: want 1 to %d bytes of visible ASCII (no spaces)", by, locksm.MaxOwnerLen)
	}
	a := af.cluster(name, stderr)
	if a == nil {
		return ExitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, af.timeout)
	defer cancel()
	if token == 0 {
		rep, err := a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpInspect, Key: key, LeaderOnly: true})
		if err != nil {
			fmt.Fprintf(stderr, "%s: reading the holder of %s from the leader: %s%s\n", name, key, strings.TrimSpace(err.Error()), clusterIDHint(err))
			return ExitError
		}
		k := rep.Key
		switch {
		case k == nil:
			fmt.Fprintln(stderr, name+": the node sent an empty report (is it an older version?)")
			return ExitError
		case k.Semaphore != nil:
			fmt.Fprintf(stderr, "%s: %s is a semaphore with %d permits held: name the permit with --token (ticketing inspect %s lists them)\n",
				name, key, k.Semaphore.Held, key)
			return ExitUsage
		case !k.Held || k.Holder == nil:
			fmt.Fprintf(stderr, "%s: %s is not held: nothing to revoke\n", name, key)
			return ExitError
		}
		token = k.Holder.Token
		fmt.Fprintf(stderr, "%s: revoking %s held by %s, token %d\n", name, key, k.Holder.Owner, token)
	}
	rep, err := a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: key, Token: token, Reason: reason, By: by})
	last := "" // what the key's last revoke says, when it is of another token
	if err != nil && (errors.Is(err, locksm.ErrTokenMismatch) || errors.Is(err, locksm.ErrNotHeld)) {
		// Perhaps revoked already (a rerun after exit 77, or another
		// operator): the key's last revoke says, while it is the latest
		// of the key (one is kept per key).
		if ir, ierr := a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpInspect, Key: key, LeaderOnly: true}); ierr == nil && ir.Key != nil && ir.Key.LastRevoke != nil {
			if ir.Key.LastRevoke.Token == token {
				fmt.Fprintf(stdout, "Already revoked %s: %s\n", key, describeRevoke(ir.Key.LastRevoke, ir.Key.AtUnixMs))
				return ExitOK
			}
			last = fmt.Sprintf("; the key's last revoke is of token %d (one is kept per key: token %d may have been revoked before it)", ir.Key.LastRevoke.Token, token)
		}
	}
	if err != nil {
		msg := strings.TrimSpace(err.Error()) + clusterIDHint(err)
		switch {
		case errors.Is(err, locksm.ErrTokenMismatch):
			fmt.Fprintf(stderr, "%s: %s is held under another token than %d now (token %d's holding ended: revoked, released or expired): this run revoked nothing%s (%s)\n",
				name, key, token, token, last, msg)
		case errors.Is(err, locksm.ErrNotHeld):
			fmt.Fprintf(stderr, "%s: %s is not held under token %d (not any more: revoked, released or expired): this run revoked nothing%s (%s)\n",
				name, key, token, last, msg)
		case errors.Is(err, wire.ErrIndeterminate):
			fmt.Fprintf(stderr, "%s: the outcome is unknown: %s\n", name, msg)
			fmt.Fprintf(stderr, "%s: \"ticketing inspect %s\" shows whether token %d was revoked; to try again, name it: \"ticketing revoke %s --token %d --reason ...\" (it never ends a newer holder, and answers \"Already revoked\" if it was)\n",
				name, key, token, key, token)
			return ExitIndeterminate
		default:
			fmt.Fprintf(stderr, "%s: %s\n", name, msg)
		}
		return ExitError
	}
	rv := rep.Revoked
	if rv == nil {
		fmt.Fprintln(stderr, name+": the node answered without the revoke's record (is it an older version?)")
		return ExitError
	}
	if af.json {
		b, _ := json.MarshalIndent(rv, "", "  ")
		if _, err := fmt.Fprintln(stdout, string(b)); err != nil {
			fmt.Fprintf(stderr, "%s: writing the record: %v\n", name, err)
			return ExitError
		}
		return ExitOK
	}
	out := &errWriter{w: stdout}
	fmt.Fprintf(out, "Revoked %s: %s\n", key, describeRevoke(rv, 0))
	switch {
	case rv.NextToken != 0 && rep.Key != nil && rep.Key.Holder != nil && rep.Key.Holder.Token == rv.NextToken:
		fmt.Fprintf(out, "Handed to %s, token %d\n", rep.Key.Holder.Owner, rv.NextToken)
	case rv.NextToken != 0:
		fmt.Fprintf(out, "Handed to token %d\n", rv.NextToken)
	case rv.Permit:
		fmt.Fprintf(out, "Its slot is free again (no waiter took it)\n")
	default:
		fmt.Fprintf(out, "Nobody was waiting: %s is free\n", key)
	}
	if out.err != nil {
		fmt.Fprintf(stderr, "%s: writing the record: %v\n", name, out.err)
		return ExitError
	}
	return ExitOK
}

// operatorName is the default --by: USER@HOSTNAME, cut to an owner id
// (visible ASCII, at most locksm.MaxOwnerLen bytes).
func operatorName() string {
	who := os.Getenv("USER")
	if who == "" {
		if u, err := user.Current(); err == nil {
			who = u.Username
		}
	}
	if who == "" {
		who = "operator"
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		who += "@" + host
	}
	b := make([]byte, 0, len(who))
	for i := 0; i < len(who) && len(b) < locksm.MaxOwnerLen; i++ {
		if c := who[i]; c > 0x20 && c < 0x7f {
			b = append(b, c)
		}
	}
	return string(b)
}
