package ticketing

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Info is the sidecar's INFO reply (unixapi/PROTOCOL.md, "INFO"), parsed.
// A field the sidecar did not send (an older one) is the zero value; "-"
// (none known) is "" for strings. Fields holds every name=value field of
// the reply, those this client does not know included, and Raw the reply
// without its "INFO " prefix.
type Info struct {
	// Cluster is the cluster id ("-" if the sidecar has none configured).
	Cluster string
	// Leader is the client address of the leader the sidecar knows; ""
	// while none is known (an election, a hand-over).
	Leader string
	// Connected and Total: the sidecar's live cluster connections over the
	// addresses it keeps.
	Connected, Total int
	// Domain is the cluster's fencing domain: tokens are comparable only
	// within one domain, so fence high-water marks are keyed by it
	// (clients/FENCING.md, "Fencing domains"). "" until a node has named
	// it. Client.Domain returns it, or ErrNoDomain.
	Domain string
	// Members is the Raft configuration as the leader last reported it,
	// nil until known.
	Members []Member
	// Protocol is the version of unixapi/PROTOCOL.md the sidecar speaks (0:
	// a version-1 sidecar, which had no such field).
	Protocol int
	// Sessions is the sidecar's --sessions setting (auto or off); Session
	// the id (hex) of its cluster session, "" when it has none;
	// SessionState its state ("" when none). See docs/sessions.md.
	Sessions, Session, SessionState string
	// SessionTimeout is the cluster session's timeout.
	SessionTimeout time.Duration
	// SessionResumes, SessionOpens, SessionHeld: resumes and opens of the
	// cluster session so far, and the locks it holds.
	SessionResumes, SessionOpens, SessionHeld int
	// SessionLastResume is what the last resume found, as sent
	// ("outcomes:<n>,queued:<n>,void:<n>,repeated:<n>").
	SessionLastResume string
	// Fields is every name=value field of the reply, by name.
	Fields map[string]string
	// Raw is the reply line without its "INFO " prefix.
	Raw string
}

// Member is one entry of INFO's members field.
type Member struct {
	ID   string // server id, NAME/INCARNATION
	Role string // voter or learner
	Addr string // its client address; "" when the leader has not recorded it yet
}

// String is the reply line without its "INFO " prefix.
func (in Info) String() string { return in.Raw }

// ParseInfo parses an INFO reply line ("INFO cluster=... leader=...");
// another reply is its error (an *Error for ERR), a malformed field
// ErrProtocol.
func ParseInfo(reply string) (Info, error) {
	rest, ok := strings.CutPrefix(reply, "INFO ")
	if !ok {
		if reply == "INFO" {
			return Info{Fields: map[string]string{}}, nil
		}
		return Info{}, outcome("INFO", reply)
	}
	in := Info{Raw: rest, Fields: map[string]string{}}
	for _, w := range strings.Split(rest, " ") {
		if w == "" {
			continue
		}
		name, value, ok := strings.Cut(w, "=")
		if !ok {
			return Info{}, unexpected("INFO", reply)
		}
		in.Fields[name] = value
	}
	dash := func(s string) string {
		if s == "-" {
			return ""
		}
		return s
	}
	num := func(name string) (int, bool) {
		s, ok := in.Fields[name]
		if !ok {
			return 0, true
		}
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= 0
	}
	f := in.Fields
	in.Cluster, in.Leader, in.Domain = f["cluster"], dash(f["leader"]), dash(f["domain"])
	in.Sessions, in.Session, in.SessionState = f["sessions"], dash(f["session"]), dash(f["session_state"])
	in.SessionLastResume = f["session_last_resume"]
	if c, ok := f["connected"]; ok {
		n, t, ok := strings.Cut(c, "/")
		var err1, err2 error
		in.Connected, err1 = strconv.Atoi(n)
		in.Total, err2 = strconv.Atoi(t)
		if !ok || err1 != nil || err2 != nil {
			return Info{}, unexpected("INFO", reply)
		}
	}
	var ms int
	for _, p := range []struct {
		name string
		v    *int
	}{{"protocol", &in.Protocol}, {"session_timeout_ms", &ms}, {"session_resumes", &in.SessionResumes},
		{"session_opens", &in.SessionOpens}, {"session_held", &in.SessionHeld}} {
		n, ok := num(p.name)
		if !ok {
			return Info{}, fmt.Errorf("%w: INFO field %s=%q is not a count", ErrProtocol, p.name, f[p.name])
		}
		*p.v = n
	}
	in.SessionTimeout = time.Duration(ms) * time.Millisecond
	if m := dash(f["members"]); m != "" {
		for _, e := range strings.Split(m, ",") {
			// <server-id>:<voter|learner>@<client-addr>: split at the first
			// "@", then at the last ":" before it (PROTOCOL.md).
			left, addr, ok1 := strings.Cut(e, "@")
			i := strings.LastIndexByte(left, ':')
			if !ok1 || i <= 0 {
				return Info{}, fmt.Errorf("%w: INFO members entry %q", ErrProtocol, e)
			}
			in.Members = append(in.Members, Member{ID: left[:i], Role: left[i+1:], Addr: dash(addr)})
		}
	}
	return in, nil
}
