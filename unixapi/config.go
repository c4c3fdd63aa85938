package unixapi

import (
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"ticketing/locksm"
	"ticketing/sidecar"
)

// Config configures a Server. Start from DefaultConfig.
type Config struct {
	// Path is the unix socket's file path. Required unless Listener is
	// set. A stale socket file there (nothing accepts on it) is removed at
	// start; a live one is an error (ErrSocketInUse), and so is any file
	// that is not a socket.
	Path string
	// Listener, if not nil, is an already listening unix stream socket to
	// serve instead of creating one at Path: the one systemd passes with
	// socket activation (LISTEN_FDS). It must be a *net.UnixListener of
	// network "unix". Path is then only informational (logs, Server.Path)
	// and may be ""; the server does not create, chmod, chown or remove
	// the socket file, so Mode and Group are not used (the socket's owner,
	// systemd's SocketMode= and SocketGroup=, decides who may connect),
	// while AllowUIDs still applies. The server owns the listener once
	// Listen succeeds, and Close closes it.
	Listener net.Listener
	// Mode is the socket file's permission bits. Connecting to a unix
	// socket needs write permission on it, so this decides who may connect.
	// Zero means 0660 (owner and group).
	Mode fs.FileMode
	// Group, if not "", is the group name or numeric gid the socket file is
	// chowned to (so a group of event-server users can connect). "" leaves
	// the group as created (the sidecar's primary group or the directory's
	// setgid group).
	Group string
	// AllowUIDs, if not nil, lists the peer uids (read with SO_PEERCRED)
	// that may use the socket; others get "ERR forbidden" and are
	// disconnected. nil allows every uid that the file mode lets connect.
	// An empty non-nil slice allows nobody.
	AllowUIDs []uint32
	// MaxLineLen is the longest request line in bytes, "\n" excluded. Zero
	// means DefaultMaxLineLen (4608). Values below 300 are refused: a
	// RELEASE with a 255-byte key needs 284. Below 4115 the longest block
	// ACQUIRE (16 keys of 255 bytes) does not fit. The memory a connection
	// costs does not grow with it: the line buffer grows with the line.
	MaxLineLen int
	// MaxConns is the most connections served at once; one more is answered
	// "ERR too_many_connections" and closed. Zero means 16384.
	MaxConns int
	// MaxInFlight is the most ACQUIREs with wait 0 one connection may have
	// running at once; one more is answered "ERR too_many_in_flight". Zero
	// means 256; at most 4096. RELEASEs are not counted: each needs a lock
	// the connection holds, which bounds them. Besides its running
	// requests, a connection may have MaxInFlight+64 answered replies
	// waiting to be written; past that the server stops reading it until
	// it can write (the back-pressure on a client that does not read).
	MaxInFlight int
	// MaxWaiting is the most ACQUIREs with a wait (> 0) one connection may
	// have running at once, waiting for their turn or on their way; one
	// more is answered "ERR too_many_waiters". Zero means 100,000 (the
	// broker's MaxWaitersPerSession default, one whole queue at the node's
	// default per key: an event server's connection can hold a sale's
	// waiting room on its own); at most 1,000,000. A waiting ACQUIRE costs
	// the sidecar about 1.2 KiB and no goroutine (BenchmarkWaiterMemory), and
	// the broker bounds the waiters of all connections together
	// (sidecar.Config.MaxWaiters).
	MaxWaiting int
	// RefusalRate is how many requests per second one connection may have
	// refused by the sidecar itself (an ERR it answers without asking the
	// cluster: a malformed line, RELEASE of a lock the connection does not
	// hold, a local limit) once RefusalBurst is spent; past it the server
	// reads that connection's next request only when the rate allows, so
	// a client stuck in a loop of bad requests is slowed, not served at
	// the expense of everyone else. Zero means 100. Measured on the 2-core
	// machine: without it, 300 connections pipelining RELEASEs of unknown
	// tokens got 600,000 not_held answers a second and raised another
	// client's acquire+release p50 86× (ticketlab bench isolation).
	// Negative: no pacing.
	RefusalRate int
	// RefusalBurst is how many refusals in a row a connection gets before
	// RefusalRate applies (refilled at that rate). Zero means 256.
	RefusalBurst int
	// OwnerPrefix starts every owner id this server sends to the cluster:
	// owner = OwnerPrefix + "." + the server's random part + "." +
	// connection number (ownerRandLen hex digits of crypto/rand, drawn
	// once per server). The whole owner must be visible ASCII
	// (0x21..0x7E) and at most 128 bytes, so the prefix is at most 90
	// bytes. "" means "<hostname>/<pid>" (sanitised), which keeps owners
	// of different sidecars apart in the cluster's logs. The prefix is for
	// people and is easily guessed; the random part is what a client that
	// holds the cluster's secret cannot guess when it tries to release
	// another host's lock (issue 39, finding 8).
	OwnerPrefix string
	// CloseTimeout bounds how long Close waits for in-flight requests to
	// finish after it cancelled them. Zero means 2 s.
	CloseTimeout time.Duration
	// Logger receives connection and release logs. nil means
	// slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every default filled in except Path.
func DefaultConfig() Config {
	return Config{
		Mode:         0o660,
		MaxLineLen:   DefaultMaxLineLen,
		MaxConns:     16384,
		MaxInFlight:  256,
		MaxWaiting:   DefaultMaxWaiting,
		RefusalRate:  100,
		RefusalBurst: 256,
		OwnerPrefix:  defaultOwnerPrefix(),
		CloseTimeout: 2 * time.Second,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Mode == 0 {
		c.Mode = d.Mode
	}
	if c.MaxLineLen == 0 {
		c.MaxLineLen = d.MaxLineLen
	}
	if c.MaxConns == 0 {
		c.MaxConns = d.MaxConns
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = d.MaxInFlight
	}
	if c.MaxWaiting == 0 {
		c.MaxWaiting = d.MaxWaiting
	}
	if c.OwnerPrefix == "" {
		c.OwnerPrefix = d.OwnerPrefix
	}
	if c.RefusalRate == 0 {
		c.RefusalRate = d.RefusalRate
	}
	if c.RefusalBurst == 0 {
		c.RefusalBurst = d.RefusalBurst
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = d.CloseTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// maxInFlight bounds Config.MaxInFlight; maxWaiting bounds MaxWaiting.
const (
	maxInFlight = 4096
	maxWaiting  = 1_000_000
)

// DefaultMaxWaiting is Config.MaxWaiting's default.
const DefaultMaxWaiting = sidecar.DefaultMaxWaitersPerSession

// ownerRandLen is the length of an owner's random part in hex digits: 64
// bits. A guess costs a committed log entry, and a wrong one is answered
// exactly like a wrong token, so 2^64 is far out of reach.
const ownerRandLen = 16

// maxOwnerPrefix leaves room for ".", the random part, "." and a 20-digit
// connection number.
const maxOwnerPrefix = locksm.MaxOwnerLen - 1 - ownerRandLen - 1 - 20

// Validate reports the first problem with c (zero fields take their
// defaults first). Errors wrap ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	switch {
	case c.Listener != nil && !isUnixStream(c.Listener):
		return bad("Listener is a %T on %q; want a unix stream socket listener", c.Listener, c.Listener.Addr().Network())
	case c.Path == "" && c.Listener == nil:
		return bad("Path is required")
	case len(c.Path) > 107 && c.Listener == nil:
		// sockaddr_un.sun_path is 108 bytes on Linux, NUL included.
		return bad("Path %q is %d bytes; unix socket paths are limited to 107", c.Path, len(c.Path))
	case c.Mode&^fs.ModePerm != 0:
		return bad("Mode %v has bits beyond the permission bits", c.Mode)
	case c.MaxLineLen < 300 || c.MaxLineLen > 1<<20:
		return bad("MaxLineLen %d outside 300..1048576", c.MaxLineLen)
	case c.MaxConns < 1:
		return bad("MaxConns %d < 1", c.MaxConns)
	case c.MaxInFlight < 1 || c.MaxInFlight > maxInFlight:
		return bad("MaxInFlight %d outside 1..%d", c.MaxInFlight, maxInFlight)
	case c.MaxWaiting < 1 || c.MaxWaiting > maxWaiting:
		return bad("MaxWaiting %d outside 1..%d", c.MaxWaiting, maxWaiting)
	case c.RefusalBurst < 1:
		return bad("RefusalBurst %d < 1", c.RefusalBurst)
	case c.CloseTimeout < 0:
		return bad("CloseTimeout %v < 0", c.CloseTimeout)
	case len(c.OwnerPrefix) > maxOwnerPrefix:
		return bad("OwnerPrefix is %d bytes, at most %d", len(c.OwnerPrefix), maxOwnerPrefix)
	}
	for i := 0; i < len(c.OwnerPrefix); i++ {
		if b := c.OwnerPrefix[i]; b < 0x21 || b > 0x7E {
			return bad("OwnerPrefix %q: byte 0x%02x outside 0x21..0x7E", c.OwnerPrefix, b)
		}
	}
	return nil
}

func isUnixStream(ln net.Listener) bool {
	ul, ok := ln.(*net.UnixListener)
	return ok && ul != nil && ul.Addr().Network() == "unix"
}

func defaultOwnerPrefix() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "sidecar"
	}
	b := []byte(host)
	for i, c := range b {
		if c < 0x21 || c > 0x7E {
			b[i] = '_'
		}
	}
	pid := strconv.Itoa(os.Getpid())
	if len(b) > maxOwnerPrefix-1-len(pid) {
		b = b[:maxOwnerPrefix-1-len(pid)]
	}
	return string(b) + "/" + pid
}
