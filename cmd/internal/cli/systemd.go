package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/raft"

	"ticketing/cluster"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// systemd integration of the node and the sidecar: sd_notify(3) readiness,
// status and stopping, the watchdog, and (sidecar) socket activation.
// Without systemd (no NOTIFY_SOCKET, WATCHDOG_USEC or LISTEN_FDS in the
// environment) all of it does nothing.

// listeners returns the sockets systemd passed (LISTEN_FDS); a variable so
// tests can pass one without fd 3.
var listeners = activation.Listeners

// readyPoll is how often readiness is checked until it is reached; after
// that, statusPoll is how often STATUS= is refreshed.
const (
	readyPoll  = 100 * time.Millisecond
	statusPoll = time.Second
)

// sdNotify sends state to systemd, if it listens; failures are logged, not
// fatal.
func sdNotify(log *slog.Logger, state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		log.Warn("sd_notify", "state", state, "err", err)
	}
}

// systemdNotifier tells systemd when the service is ready and what it is
// doing (READY=1, STATUS=), keeps its watchdog fed, and says STOPPING=1.
type systemdNotifier struct {
	log         *slog.Logger
	stopStatus  context.CancelFunc // ends the readiness poller
	stopAll     context.CancelFunc // ends the watchdog too
	wg          sync.WaitGroup
	statusDone  chan struct{} // closed when the readiness poller has ended
	stoppingNow atomic.Bool
}

// startSystemd starts the notifier. status reports whether the service is
// ready and a one-line status; it is polled every readyPoll until ready
// (then READY=1 is sent once), and every statusPoll after, sending STATUS=
// when the line changes. alive is the watchdog's liveness check: while it
// returns nil, WATCHDOG=1 is sent every half watchdog interval; readiness
// is deliberately not part of it (a node waiting out a long election, or a
// sidecar whose cluster is down, is alive and must not be killed: killing
// it would not help, and READY has its own start timeout).
func startSystemd(log *slog.Logger, status func() (ready bool, line string), alive func() error) *systemdNotifier {
	ctx, stopAll := context.WithCancel(context.Background())
	sctx, stopStatus := context.WithCancel(ctx)
	s := &systemdNotifier{log: log.With("part", "systemd"), stopStatus: stopStatus, stopAll: stopAll,
		statusDone: make(chan struct{})}
	if os.Getenv("NOTIFY_SOCKET") == "" {
		close(s.statusDone)
		return s // not under systemd (or not Type=notify): nothing to say
	}
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		s.log.Warn("watchdog settings unusable; not feeding the watchdog", "err", err)
	}
	if interval > 0 {
		s.wg.Add(1)
		go s.watchdog(ctx, interval/2, alive)
	}
	s.wg.Add(1)
	go s.readiness(sctx, status)
	return s
}

func (s *systemdNotifier) readiness(ctx context.Context, status func() (bool, string)) {
	defer s.wg.Done()
	defer close(s.statusDone)
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	sentReady, last := false, ""
	for {
		ready, line := status()
		var msg string
		if line != last {
			msg = "STATUS=" + line
			last = line
		}
		if ready && !sentReady {
			msg = daemon.SdNotifyReady + "\nSTATUS=" + line
			sentReady = true
			s.log.Info("ready; told systemd", "status", line)
			t.Reset(statusPoll)
		}
		if msg != "" {
			sdNotify(s.log, msg)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *systemdNotifier) watchdog(ctx context.Context, every time.Duration, alive func() error) {
	defer s.wg.Done()
	s.log.Info("feeding the systemd watchdog", "every", every)
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		// While stopping, the process is expected to be tearing down what
		// alive checks; TimeoutStopSec= bounds a stop that hangs.
		if err := alive(); err != nil && !s.stoppingNow.Load() {
			if !failing {
				s.log.Error("not alive; no longer feeding the watchdog", "err", err)
			}
			failing = true
		} else {
			if failing {
				s.log.Info("alive again; feeding the watchdog")
			}
			failing = false
			sdNotify(s.log, daemon.SdNotifyWatchdog)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// stopping tells systemd the service is shutting down (STOPPING=1) and
// stops the readiness poller. The watchdog is fed until close, without its
// liveness check, as systemd keeps enforcing it while a service stops.
func (s *systemdNotifier) stopping(why string) {
	s.stoppingNow.Store(true)
	s.stopStatus()
	<-s.statusDone // so no STATUS= of its overtakes ours
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return
	}
	sdNotify(s.log, daemon.SdNotifyStopping+"\nSTATUS="+why)
}

// close stops the notifier's goroutines and waits for them.
func (s *systemdNotifier) close() {
	s.stopAll()
	s.wg.Wait()
}

// activatedListener returns the unix stream socket systemd passed with
// socket activation, or nil without one. More than one socket, or one of
// another kind, is an error: the sidecar serves exactly one unix socket.
func activatedListener() (*net.UnixListener, error) {
	lns, err := listeners()
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	var got []net.Listener
	for _, ln := range lns {
		if ln != nil { // nil: an fd that is not a listening socket
			got = append(got, ln)
		}
	}
	switch {
	case len(got) == 0 && len(lns) == 0:
		return nil, nil
	case len(got) != 1:
		for _, ln := range got {
			ln.Close()
		}
		return nil, fmt.Errorf("socket activation: systemd passed %d file descriptors (%d listening sockets); "+
			"want one unix stream socket (ListenStream=/path)", len(lns), len(got))
	}
	ul, ok := got[0].(*net.UnixListener)
	if !ok || ul.Addr().Network() != "unix" {
		got[0].Close()
		return nil, fmt.Errorf("socket activation: systemd passed a %s socket (%s); want a unix stream socket "+
			"(ListenStream=/path)", got[0].Addr().Network(), got[0].Addr())
	}
	return ul, nil
}

// nodeStatus is the node's readiness for systemd: READY once it is part of
// a configuration with a known leader (cluster.Node.Ready).
func nodeStatus(n *cluster.Node) (bool, string) {
	if err := n.Ready(); err != nil {
		return false, "not ready: " + err.Error()
	}
	if n.Serving() {
		return true, "ready: leader, serving clients"
	}
	_, id := n.Raft().LeaderWithID()
	return true, "ready: following leader " + string(id)
}

// nodeAlive is the node's watchdog check: Raft has not shut down, and the
// node's lock can be taken (a node deadlocked on it stops feeding the
// watchdog and is restarted). Elections and lost quorum do not count.
func nodeAlive(n *cluster.Node) error {
	if n.Raft().State() == raft.Shutdown {
		return errors.New("raft has shut down")
	}
	n.Serving()
	return nil
}

// sidecarStatus is the sidecar's readiness for systemd: READY once the
// broker knows a serving leader and is connected to it (Broker.Ready).
func sidecarStatus(b *sidecar.Broker) (bool, string) {
	if err := b.Ready(); err != nil {
		return false, "not ready: " + err.Error()
	}
	return true, "ready: connected to leader " + b.Info().Leader
}

// sidecarAlive is the sidecar's watchdog check: the broker is open, and
// the broker's and the socket server's locks can be taken. A cluster that
// cannot be reached does not count.
func sidecarAlive(b *sidecar.Broker, srv *unixapi.Server) error {
	if err := b.Ready(); errors.Is(err, sidecar.ErrClosed) {
		return err
	}
	srv.Conns()
	return nil
}
