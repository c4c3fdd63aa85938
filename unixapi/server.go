// Package unixapi serves Ticketing's local API: a line protocol over a unix
// stream socket (PROTOCOL.md next to this file is the contract), backed by a
// sidecar.Broker that holds the persistent connections to the cluster.
//
// A connection is a session. It owns what it acquires: only it may release
// those locks, and when it closes (the client exits or crashes) the server
// releases every lock it holds at once with the known token and cancels its
// pending acquires, so a crashed event server frees its keys in
// milliseconds rather than at lease expiry.
//
// The package has four parts: parser.go (a socket-free, bounded line
// splitter and parser), errors.go (the sentinels and the one table from
// errors to reply lines), config.go, and this file with session.go
// (sockets, sessions, ordering).
package unixapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"ticketing/sidecar"
)

// Broker is what the server needs of a *sidecar.Broker; tests may fake it.
// Its calls must not block: an ACQUIRE or RELEASE waits without a
// goroutine, in the broker (see sidecar.Broker.AcquireAsync).
type Broker interface {
	// AcquireAsyncOpts acquires one key or a block (sidecar.Broker's); its
	// opts.Queued tells when the cluster queued it, which the server passes
	// on as the QUEUED event (version 4).
	AcquireAsyncOpts(keys []string, owner string, lease, wait time.Duration, opts sidecar.AcquireOptions,
		done func(sidecar.Lock, error)) (cancel func(error), err error)
	ReleaseAsync(l sidecar.Lock, done func(error)) error
	ExtendAsync(l sidecar.Lock, lease time.Duration, done func(sidecar.Lock, error)) error
	// SetPermitsAsync sets a semaphore's number of permits (PERMITS,
	// version 8).
	SetPermitsAsync(key string, n uint32, done func(error)) error
	// WatchLoss tells fn how a held lock ended without its RELEASE
	// (the LOST event; for a revoke also who and why, REVOKED, version 9).
	WatchLoss(l sidecar.Lock, fn func(sidecar.Loss)) (stop func())
	Compensate(l sidecar.Lock)
	Info() sidecar.Info
}

var _ Broker = (*sidecar.Broker)(nil)

// Server serves the unix API on one socket. Create it with Listen.
type Server struct {
	cfg    Config
	broker Broker
	log    *slog.Logger
	ln     *net.UnixListener
	sockFI os.FileInfo // the socket file we created, to remove only ours

	// hardCtx ends the waiting for requests at Close: a RELEASE outlives
	// its connection on purpose (a release already asked for is finished,
	// not abandoned, within the broker's deadline), and Close waits for
	// it, until its grace period is over and it cancels hardCtx.
	hardCtx    context.Context
	hardCancel context.CancelFunc

	// ownerBase starts every owner this server sends: OwnerPrefix, ".",
	// the random part, "." (the connection number follows).
	ownerBase string
	connSeq   atomic.Uint64
	paced     atomic.Uint64 // Stats.PacedRefusals
	// mu guards sessions and closed. It is never held together with a
	// session's mu, nor while calling the Broker or doing socket I/O
	// (cluster/LOCKS.md, "Above the cluster").
	mu       sync.Mutex
	sessions map[*session]struct{}
	closed   bool
	wg       sync.WaitGroup // accept loop and every session

	// Refusal counters (Stats).
	forbidden, tooMany atomic.Uint64
	// lostTold counts the LOST event lines queued for connections, by
	// sidecar.LostReason (Stats.LostEvents).
	lostTold [sidecar.LostRevoked + 1]atomic.Uint64
	// queuedTold counts the QUEUED event lines queued for connections
	// (Stats.QueuedEvents).
	queuedTold atomic.Uint64
	// positionTold counts the POSITION event lines queued for
	// connections (Stats.PositionEvents).
	positionTold atomic.Uint64
}

// queuedEvent counts a QUEUED line queued for a connection.
func (s *Server) queuedEvent() { s.queuedTold.Add(1) }

// positionEvent counts a POSITION line queued for a connection.
func (s *Server) positionEvent() { s.positionTold.Add(1) }

// lostEvent counts a lock a connection lost (why), and whether it was told.
func (s *Server) lostEvent(why sidecar.LostReason, told bool) {
	if told && int(why) < len(s.lostTold) {
		s.lostTold[why].Add(1)
	}
}

// Listen creates the socket at cfg.Path with cfg.Mode and cfg.Group (or
// takes cfg.Listener as it is) and starts serving it in the background.
func Listen(cfg Config, b Broker) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if b == nil {
		return nil, fmt.Errorf("%w: nil broker", ErrInvalidConfig)
	}
	var (
		ln *net.UnixListener
		fi os.FileInfo
	)
	if cfg.Listener != nil {
		// Socket activation: the socket and its file are systemd's.
		ln = cfg.Listener.(*net.UnixListener) // Validate checked
		ln.SetUnlinkOnClose(false)
		if cfg.Path == "" {
			cfg.Path = ln.Addr().String()
		}
	} else {
		gid := -1
		if cfg.Group != "" {
			var err error
			if gid, err = lookupGroup(cfg.Group); err != nil {
				return nil, fmt.Errorf("%w: Group: %w", ErrInvalidConfig, err)
			}
		}
		var err error
		if ln, fi, err = listenSocket(cfg.Path, cfg.Mode, gid); err != nil {
			return nil, err
		}
	}
	s := &Server{
		cfg: cfg, broker: b, log: cfg.Logger.With("socket", cfg.Path), ln: ln, sockFI: fi,
		sessions: map[*session]struct{}{}, ownerBase: cfg.OwnerPrefix + "." + ownerRand() + ".",
	}
	s.hardCtx, s.hardCancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.acceptLoop()
	if cfg.Listener != nil {
		s.log.Info("unix API serving an inherited socket (socket activation)",
			"allow_uids", cfg.AllowUIDs, "owners", s.ownerBase+"N")
	} else {
		s.log.Info("unix API listening", "mode", fmt.Sprintf("%#o", cfg.Mode), "group", cfg.Group,
			"allow_uids", cfg.AllowUIDs, "owners", s.ownerBase+"N")
	}
	return s, nil
}

// ownerRand is an owner's random part: ownerRandLen lower-case hex
// digits from crypto/rand (whose Read never fails: it crashes the
// program rather than return weak bytes).
func ownerRand() string {
	var b [ownerRandLen / 2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Path returns the socket path.
func (s *Server) Path() string { return s.cfg.Path }

// Conns returns the number of connections being served.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// Stats counts the connections the server refused.
type Stats struct {
	Forbidden    uint64 // peer uid not allowed (or its credentials unreadable)
	TooManyConns uint64 // MaxConns reached
	// PacedRefusals counts refusals after which a connection's reading
	// was held back (RefusalRate).
	PacedRefusals uint64
	// LostEvents counts the LOST event lines queued for connections that
	// turned events on, by reason (index sidecar.LostExpired, LostMoved,
	// LostCompensated, LostRevoked).
	LostEvents [sidecar.LostRevoked + 1]uint64
	// QueuedEvents counts the QUEUED event lines queued for connections
	// (version 4 with events on).
	QueuedEvents uint64
	// PositionEvents counts the POSITION event lines queued for
	// connections (version 7 with events on).
	PositionEvents uint64
}

// Stats returns the server's refusal counters (they only grow).
func (s *Server) Stats() Stats {
	st := Stats{Forbidden: s.forbidden.Load(), TooManyConns: s.tooMany.Load(), PacedRefusals: s.paced.Load(),
		QueuedEvents: s.queuedTold.Load(), PositionEvents: s.positionTold.Load()}
	for i := range s.lostTold {
		st.LostEvents[i] = s.lostTold[i].Load()
	}
	return st
}

// Close stops accepting, ends every session (releasing each held lock with
// Compensate once the session's LOST lines are written, within a second,
// else leaving it to its lease; and cancelling pending acquires), waits up to CloseTimeout for
// in-flight requests, and removes the socket file (not an inherited one:
// Config.Listener). The broker is the
// caller's to close, afterwards.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	sessions := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	err := s.ln.Close()
	// Only remove the file if it is still the socket we created: a second
	// sidecar started by mistake must not lose its socket to our shutdown.
	// An inherited socket (Config.Listener) is never ours to remove.
	if fi, lerr := os.Lstat(s.cfg.Path); s.sockFI != nil && lerr == nil && os.SameFile(fi, s.sockFI) {
		os.Remove(s.cfg.Path)
	}
	// In parallel: each waits (bounded) for its LOST lines to be written.
	var ended sync.WaitGroup
	for _, ss := range sessions {
		ended.Add(1)
		go func() {
			defer ended.Done()
			ss.endCause("server closing", ErrServerClosed)
		}()
	}
	ended.Wait()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.CloseTimeout):
		s.log.Warn("requests still running at close; abandoning them", "after", s.cfg.CloseTimeout)
		s.hardCancel()
		select {
		case <-done:
		case <-time.After(time.Second):
		}
	}
	s.hardCancel()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and friends: back off instead of spinning, as
			// net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.admit(c)
	}
}

// admit checks the peer and the connection limit, then starts a session.
func (s *Server) admit(c *net.UnixConn) {
	id := s.connSeq.Add(1)
	cred, err := peerCred(c)
	log := s.log.With("conn", id)
	if err != nil {
		log.Warn("SO_PEERCRED failed; refusing", "err", err)
		s.forbidden.Add(1)
		s.refuse(c, fmt.Errorf("%w: cannot read peer credentials", ErrForbidden))
		return
	}
	log = log.With("uid", cred.Uid, "gid", cred.Gid, "pid", cred.Pid)
	if !s.allowed(cred.Uid) {
		log.Warn("peer uid not allowed; refusing")
		s.forbidden.Add(1)
		s.refuse(c, fmt.Errorf("%w: uid %d may not use this socket", ErrForbidden, cred.Uid))
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.refuse(c, ErrServerClosed)
		return
	}
	if len(s.sessions) >= s.cfg.MaxConns {
		s.mu.Unlock()
		log.Warn("too many connections; refusing", "max", s.cfg.MaxConns)
		s.tooMany.Add(1)
		s.refuse(c, fmt.Errorf("%w: the sidecar serves %d connections already", ErrTooManyConns, s.cfg.MaxConns))
		return
	}
	ss := newSession(s, c, id, log)
	s.sessions[ss] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		ss.run()
		s.mu.Lock()
		delete(s.sessions, ss)
		s.mu.Unlock()
	}()
}

// refuse answers one ERR line and closes, off the accept loop so a peer that
// never reads cannot stall accepting.
func (s *Server) refuse(c *net.UnixConn, err error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		c.SetWriteDeadline(time.Now().Add(time.Second))
		if _, werr := c.Write([]byte(replyFor(err) + "\n")); werr != nil {
			s.log.Debug("refusal not delivered", "reason", err, "err", werr) // the close below ends it anyway
		}
		c.Close()
	}()
}

func (s *Server) allowed(uid uint32) bool {
	if s.cfg.AllowUIDs == nil {
		return true
	}
	for _, u := range s.cfg.AllowUIDs {
		if u == uid {
			return true
		}
	}
	return false
}

// peerCred reads the peer's credentials as the kernel recorded them at
// connect time (SO_PEERCRED), which the peer cannot forge.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, serr
}

func lookupGroup(g string) (int, error) {
	if n, err := strconv.Atoi(g); err == nil && n >= 0 {
		return n, nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return -1, err
	}
	return strconv.Atoi(grp.Gid)
}

// listenSocket creates the listening socket at path with mode and gid
// (gid -1: unchanged). To be umask-safe it binds a temporary name in the
// same directory, sets mode and group there, and only then renames it into
// place (without replacing anything), so no client ever sees the socket
// with looser permissions than asked for.
func listenSocket(path string, mode os.FileMode, gid int) (*net.UnixListener, os.FileInfo, error) {
	if err := removeStale(path); err != nil {
		return nil, nil, err
	}
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%d.tmp", filepath.Base(path), os.Getpid()))
	if len(tmp) > 107 {
		// No room for a temporary name: bind in place; the umask decides
		// the mode until the chmod below.
		tmp = path
	}
	os.Remove(tmp) // a leftover of a crashed earlier run with our pid
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	// We remove the file ourselves in Close, and only if it is still ours.
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, os.FileInfo, error) {
		ln.Close()
		os.Remove(tmp)
		return nil, nil, err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(err)
	}
	if gid >= 0 {
		if err := os.Chown(tmp, -1, gid); err != nil {
			return fail(fmt.Errorf("chown socket to gid %d: %w", gid, err))
		}
	}
	if tmp != path {
		err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE)
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSYS) {
			err = os.Rename(tmp, path) // file system without RENAME_NOREPLACE
		}
		if errors.Is(err, syscall.EEXIST) {
			return fail(fmt.Errorf("%w: %s appeared while starting (another sidecar?)", ErrSocketInUse, path))
		}
		if err != nil {
			return fail(err)
		}
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	return ln, fi, nil
}

// removeStale removes a socket file nobody accepts on (left by a crash). A
// socket somebody accepts on, or any other kind of file, is left alone.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("%w: %s exists and is not a socket", ErrSocketInUse, path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%w: a process is accepting connections on %s", ErrSocketInUse, path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%w: cannot tell whether %s is in use: %w", ErrSocketInUse, path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
