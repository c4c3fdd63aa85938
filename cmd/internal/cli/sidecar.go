package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"ticketing/cluster"
	"ticketing/cluster/tlsconf"
	"ticketing/cmd/internal/gctune"
	"ticketing/locksm"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// defaultSocket is the socket the client commands use without --socket.
func defaultSocket() string {
	if s := os.Getenv("TICKETING_SOCKET"); s != "" {
		return s
	}
	return "./ticketing.sock"
}

func runSidecar(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return RunSidecar(ctx, args, stdout, stderr, SidecarOptions{})
}

// SidecarOptions are what a caller of RunSidecar plugs into the sidecar
// command; the zero value is `ticketing sidecar`. The lab's `ticketlab
// sidecar` is this command with a dropping dialer plugged into
// sidecar.Config.Dialer; the product itself sets none.
type SidecarOptions struct {
	// Name is the command's name in its usage; "":
	// "ticketing sidecar".
	Name string
	// Flags, when set, adds the caller's flags to the command's.
	Flags func(fs *flag.FlagSet)
	// Setup, when set, is called with the parsed broker config before the
	// broker starts, and may set its seams. ctx ends when the command is
	// told to stop. An error refuses to start (exit 2).
	Setup func(ctx context.Context, cfg *sidecar.Config, log *slog.Logger) error
}

// RunSidecar runs the sidecar command with o's additions until ctx ends,
// and returns its exit code.
func RunSidecar(ctx context.Context, args []string, stdout, stderr io.Writer, o SidecarOptions) int {
	name := o.Name
	if name == "" {
		name = "ticketing sidecar"
	}
	fl := newCmdFlags(name, name+" --cluster HOST:PORT,... --secret-file F [--tls-ca CA] [--socket PATH] [flags]\n"+
		"       "+name+" --config FILE [flags]",
		"Serves the unix-socket API (unixapi/PROTOCOL.md) to local programs, connected to\n"+
			"the cluster's nodes. Every flag can also be set in the --config file (name = value,\n"+
			"the long flag name without dashes) or as $TICKETING_<NAME>.", stdout, stderr)
	fset := fl.FlagSet
	ucfg := unixapi.DefaultConfig()
	var (
		addrs, secretFile, clusterID string
		nextSecret, bcfgDomain       string
		mode                         = socketMode(0o660)
		allow                        uidList
		tf                           tlsFlags
		logs                         logFlags
	)
	fset.StringVar(&addrs, "cluster", "", "the cluster nodes' client addresses: HOST:PORT,HOST:PORT,HOST:PORT")
	fset.StringVar(&ucfg.Path, "socket", defaultSocket(), "unix socket to serve: $TICKETING_SOCKET when set, else ./ticketing.sock")
	fset.StringVar(&secretFile, "secret-file", "", "file holding the cluster's client secret (mode 600)")
	fset.StringVar(&clusterID, "cluster-id", "", "cluster id the nodes present (as their --cluster-id)")
	fset.StringVar(&bcfgDomain, "domain", "", "the fencing domain the nodes must belong to (INFO's domain=); default: hold to the first one a node names")
	fset.StringVar(&nextSecret, "next-secret-file", "", "rollover: a second client secret, tried when a node does not accept the first")
	tf.register(fset, false)
	fset.Var(&mode, "socket-mode", "permission bits of the socket file, octal (connecting needs write permission)")
	fset.StringVar(&ucfg.Group, "socket-group", "", "group name or gid to give the socket file (default: unchanged)")
	fset.Var(&allow, "allow-uid", "comma-separated peer uids allowed to connect (default: any uid the file mode admits)")
	fset.IntVar(&ucfg.MaxConns, "max-conns", ucfg.MaxConns, "max local connections served at once")
	fset.StringVar(&ucfg.OwnerPrefix, "owner-prefix", ucfg.OwnerPrefix, "prefix of the owner ids sent to the cluster (owner = PREFIX.RANDOM.CONN; at most 90 bytes)")
	var maxWaiters int
	fset.IntVar(&maxWaiters, "max-waiters", 0,
		"max waiting ACQUIREs (with a wait) of all local connections together; when full, the connection holding the most is refused or evicted (too_many_waiters); 0: the node's per-connection bound (200000 by default)")
	fset.IntVar(&ucfg.MaxWaiting, "max-waiters-per-conn", ucfg.MaxWaiting,
		"max waiting ACQUIREs (with a wait) of one local connection (too_many_waiters); about 1.2 KiB of sidecar memory each")
	fset.IntVar(&ucfg.MaxInFlight, "max-inflight-per-conn", ucfg.MaxInFlight,
		"max ACQUIREs with wait 0 running at once on one local connection (too_many_in_flight); RELEASEs are not limited")
	fset.IntVar(&ucfg.RefusalRate, "refusal-rate", ucfg.RefusalRate,
		"requests per second one local connection may have refused by the sidecar itself (ERR without asking the cluster: bad lines, RELEASE of a lock it does not hold) once a burst of 256 is spent; past it the connection is read more slowly; negative: no pacing")
	var membersRefresh time.Duration
	fset.DurationVar(&membersRefresh, "members-refresh", sidecar.DefaultMembersRefresh,
		"how often to ask the leader for the members and follow them (dial new members' client addresses, drop those of removed ones; the --cluster addresses are always kept); 0: only on leader changes")
	sessions := sessionsFlag(sidecar.SessionsAuto)
	fset.Var(&sessions, "sessions",
		"`mode`: auto (the default), hold a session in the cluster's replicated state whenever the leader speaks it (cluster protocol version 7), so waiting ACQUIREs keep their place and requests get a definite answer across a leader change; off, never (a leader change then withdraws the waiters, as with older nodes)")
	sessionTimeout := sessionTimeoutFlag(sidecar.DefaultSessionTimeout)
	fset.Var(&sessionTimeout, "session-timeout",
		"the `duration` the cluster keeps this sidecar's session while no connection of it reaches the leader (a crash, a partition) before it expires it: its waiters leave the lines and grants it was never told of are released; the locks it delivered keep their leases; "+
			sessionTimeoutBounds)
	logs.register(fset, "info")
	var (
		prof    pprofFlag
		metrics metricsFlag
	)
	prof.register(fset)
	metrics.register(fset)
	if o.Flags != nil {
		o.Flags(fset)
	}
	if code, ok := fl.parseConfigured(args); !ok {
		return code
	}
	if fset.NArg() != 0 {
		return fl.bad("unexpected arguments %q", fset.Args())
	}
	log, _ := logs.logger(stderr)
	stopProf, err := prof.start(log)
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return ExitUsage
	}
	defer stopProf()
	gctune.Start(ctx, gctune.DefaultConfig())
	bcfg := sidecar.DefaultConfig()
	for _, a := range strings.Split(addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			bcfg.Addrs = append(bcfg.Addrs, a)
		}
	}
	if len(bcfg.Addrs) == 0 || secretFile == "" {
		return fl.bad("--cluster and --secret-file are required")
	}
	if bcfg.Secret, err = cluster.ReadSecretFile(secretFile); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return ExitUsage
	}
	if nextSecret != "" {
		if bcfg.NextSecret, err = cluster.ReadSecretFile(nextSecret); err != nil {
			fmt.Fprintln(stderr, name+":", err)
			return ExitUsage
		}
	}
	if err := tf.plaintextAllowed(bcfg.Addrs...); err != nil {
		fmt.Fprintln(stderr, name+": refusing to start:", err)
		return ExitUsage
	}
	if tf.files.Enabled() {
		if bcfg.TLS, err = tlsconf.ClientConfig(tf.files); err != nil {
			fmt.Fprintln(stderr, name+":", err)
			return ExitUsage
		}
		bcfg.TLS.ServerName = tf.serverName
	} else {
		log.Warn("PLAINTEXT: the connections to the cluster are not encrypted; use --tls-ca anywhere but loopback")
	}
	bcfg.ClusterID, bcfg.Domain = clusterID, bcfgDomain
	if maxWaiters < 0 {
		return fl.bad("--max-waiters %d: must not be negative", maxWaiters)
	}
	// A connection is a session of the broker: the two per-session bounds
	// are one setting.
	bcfg.MaxWaiters, bcfg.MaxWaitersPerSession = maxWaiters, ucfg.MaxWaiting
	bcfg.MembersRefresh = membersRefresh
	bcfg.Sessions, bcfg.SessionTimeout = sidecar.SessionsMode(sessions), time.Duration(sessionTimeout)
	if membersRefresh <= 0 {
		bcfg.MembersRefresh = -1
	}
	// Addresses learned from the cluster obey the same plaintext rule as
	// the --cluster ones.
	bcfg.AllowAddr = func(addr string) error { return tf.plaintextAllowed(addr) }
	ucfg.Mode = fs.FileMode(mode)
	if allow.set {
		ucfg.AllowUIDs = append([]uint32{}, allow.uids...)
	}
	activated, err := activatedListener()
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return ExitError
	}
	if activated != nil {
		// The socket, its file and its permissions are systemd's.
		log.Info("socket activation: serving the socket systemd passed; --socket, --socket-mode and --socket-group are not used",
			"socket", activated.Addr().String())
		ucfg.Listener, ucfg.Path = activated, ""
	}
	if o.Setup != nil {
		if err := o.Setup(ctx, &bcfg, log); err != nil {
			fmt.Fprintln(stderr, name+":", err)
			return ExitUsage
		}
	}
	b, srv, err := startSidecar(bcfg, ucfg, log)
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return ExitError
	}
	registerUnixMetrics(b.MetricsRegistry(), srv)
	msrv, err := metrics.start(b.MetricsRegistry(), b.Ready, log)
	if err != nil {
		fmt.Fprintln(stderr, name+": --metrics-addr:", err)
		stopSidecar(b, srv, log)
		return ExitUsage
	}
	if msrv != nil {
		defer msrv.Close()
	}
	// READY=1 waits for the cluster, but the socket is served already:
	// requests wait or fail as they would at any leader change.
	sd := startSystemd(log, func() (bool, string) { return sidecarStatus(b) }, func() error { return sidecarAlive(b, srv) })
	defer sd.close()
	<-ctx.Done()
	sd.stopping("shutting down: releasing the locks of every connection")
	log.Info("shutting down: releasing the locks of every connection")
	stopSidecar(b, srv, log)
	return ExitOK
}

// startSidecar starts a Broker and serves it on the unix socket.
func startSidecar(bcfg sidecar.Config, ucfg unixapi.Config, log *slog.Logger) (*sidecar.Broker, *unixapi.Server, error) {
	bcfg.Logger = log.With("part", "broker")
	ucfg.Logger = log.With("part", "unixapi")
	if err := ucfg.Validate(); err != nil {
		return nil, nil, err
	}
	b, err := sidecar.New(bcfg)
	if err != nil {
		return nil, nil, err
	}
	srv, err := unixapi.Listen(ucfg, b)
	if err != nil {
		b.Close()
		return nil, nil, err
	}
	return b, srv, nil
}

// registerUnixMetrics adds the unix socket's gauges and counters to the
// broker's registry.
func registerUnixMetrics(reg prometheus.Registerer, srv *unixapi.Server) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ticketing_sidecar_local_connections",
			Help: "Connections served on the sidecar's unix socket.",
		}, func() float64 { return float64(srv.Conns()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "ticketing_sidecar_local_refusals_total",
			Help:        "Unix socket connections refused: forbidden (peer uid not allowed), too_many_conns (--max-conns).",
			ConstLabels: prometheus.Labels{"reason": "forbidden"},
		}, func() float64 { return float64(srv.Stats().Forbidden) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "ticketing_sidecar_local_refusals_total",
			Help:        "Unix socket connections refused: forbidden (peer uid not allowed), too_many_conns (--max-conns).",
			ConstLabels: prometheus.Labels{"reason": "too_many_conns"},
		}, func() float64 { return float64(srv.Stats().TooManyConns) }),
	)
	for _, why := range sidecar.LostReasons {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "ticketing_sidecar_local_lost_events_total",
			Help:        "LOST event lines written to unix-socket connections that turned events on (HELLO 3 events), by reason: expired, moved, compensated, revoked.",
			ConstLabels: prometheus.Labels{"reason": why.String()},
		}, func() float64 { return float64(srv.Stats().LostEvents[why]) }))
	}
}

// stopSidecar closes the server first (its sessions hand their locks to
// the broker's release queue), then the broker, which finishes that queue.
func stopSidecar(b *sidecar.Broker, srv *unixapi.Server, log *slog.Logger) {
	if err := srv.Close(); err != nil {
		log.Warn("closing the unix socket", "err", err)
	}
	if err := b.Close(); err != nil {
		log.Warn("closing the broker", "err", err)
	}
}

// sessionsFlag is --sessions: auto or off, checked when set.
type sessionsFlag sidecar.SessionsMode

func (m *sessionsFlag) String() string { return sidecar.SessionsMode(*m).String() }

func (m *sessionsFlag) Set(s string) error {
	v, err := sidecar.ParseSessionsMode(s)
	if err != nil {
		return fmt.Errorf("want auto or off, got %q", s)
	}
	*m = sessionsFlag(v)
	return nil
}

// sessionTimeoutFlag is --session-timeout: a duration within the bounds
// the cluster accepts (locksm's), checked when set, so that a bad value
// stops the sidecar at its start (naming the file and line when it comes
// from --config) rather than at its first session open.
type sessionTimeoutFlag time.Duration

// sessionTimeoutBounds says the bounds in the units they are typed in.
var sessionTimeoutBounds = fmt.Sprintf("a duration %ds..%ds in whole milliseconds",
	locksm.MinSessionTimeoutMs/1000, locksm.MaxSessionTimeoutMs/1000)

func (d *sessionTimeoutFlag) String() string { return time.Duration(*d).String() }

func (d *sessionTimeoutFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil || v%time.Millisecond != 0 || v.Milliseconds() < locksm.MinSessionTimeoutMs || v.Milliseconds() > locksm.MaxSessionTimeoutMs {
		return fmt.Errorf("want %s, such as 10s", sessionTimeoutBounds)
	}
	*d = sessionTimeoutFlag(v)
	return nil
}

// socketMode is --socket-mode: octal permission bits, checked when set.
type socketMode fs.FileMode

func (m *socketMode) String() string { return fmt.Sprintf("%04o", uint32(*m)) }

func (m *socketMode) Set(s string) error {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v == 0 || v > 0o777 {
		return fmt.Errorf("want octal permission bits 1..0777 such as 0660, got %q", s)
	}
	*m = socketMode(v)
	return nil
}

// uidList is --allow-uid: comma-separated uids, checked when set.
type uidList struct {
	set  bool
	uids []uint32
}

func (u *uidList) String() string {
	var s []string
	for _, id := range u.uids {
		s = append(s, strconv.FormatUint(uint64(id), 10))
	}
	return strings.Join(s, ",")
}

func (u *uidList) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		u.set, u.uids = false, nil // unset: any uid the file mode admits
		return nil
	}
	var uids []uint32
	for _, f := range strings.Split(s, ",") {
		id, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
		if err != nil {
			return fmt.Errorf("want comma-separated numeric uids, got %q", f)
		}
		uids = append(uids, uint32(id))
	}
	u.set, u.uids = true, uids
	return nil
}
