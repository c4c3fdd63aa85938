package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/console"
)

// consoleFlag is the node's --console-addr: the operators' web console
// (cluster/console; docs/operations.md, "On-sale day").
type consoleFlag struct{ addr string }

func (c *consoleFlag) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "console-addr", "", "HOST:PORT to serve the operators' web console on (default: off). With --admin-secret-file "+
		"the page asks for the admin secret once; beyond loopback it needs TLS (--tls-cert, served as HTTPS) and the admin secret")
}

// errConsoleExposed: a console beyond loopback without TLS or the admin
// secret.
var errConsoleExposed = errors.New("cli: --console-addr beyond loopback needs TLS (--tls-cert) and the admin secret (--admin-secret-file)")

// check refuses what may not run, before the node starts.
func (c *consoleFlag) check(cfg *cluster.Config) error {
	if c.addr == "" || isLoopback(c.addr) {
		return nil
	}
	if cfg.ClientTLS == nil || cfg.AdminSecret == nil {
		return fmt.Errorf("%w: %s", errConsoleExposed, c.addr)
	}
	return nil
}

// start serves the console of n until ctx ends; stop closes it. nil, nil
// without --console-addr.
func (c *consoleFlag) start(ctx context.Context, n *cluster.Node, cfg *cluster.Config, log *slog.Logger) (stop func(), err error) {
	if c.addr == "" {
		return nil, nil
	}
	_, stop, err = serveConsole(ctx, c.addr, n.ConsoleSource(), cfg.AdminSecret, cfg.ClientTLS, log)
	return stop, err
}

// serveConsole serves source's console on addr: HTTPS with tlsCfg's
// certificate when it is set and addr is beyond loopback, else HTTP; with
// a login when secret is set.
func serveConsole(ctx context.Context, addr string, source console.Source, secret []byte, tlsCfg *tls.Config,
	log *slog.Logger) (url string, stop func(), err error) {
	log = log.With("part", "console")
	useTLS := tlsCfg != nil && !isLoopback(addr)
	ccfg := console.DefaultConfig(source)
	ccfg.Secret, ccfg.SecureCookie, ccfg.Logger = secret, useTLS, log
	con, err := console.New(ccfg)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: con.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	scheme := "http"
	if useTLS {
		tc := tlsCfg.Clone()
		tc.NextProtos = []string{"h2", "http/1.1"}
		tc.ClientAuth = tls.NoClientCert // a browser presents none: the secret authenticates
		ln = tls.NewListener(ln, tc)
		scheme = "https"
	}
	cctx, cancel := context.WithCancel(ctx)
	go con.Run(cctx)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("console stopped", "err", err)
		}
	}()
	url = scheme + "://" + ln.Addr().String() + "/"
	log.Info("serving the web console", "url", url, "login", secret != nil)
	return url, func() {
		cancel()
		sctx, done := context.WithTimeout(context.Background(), 2*time.Second)
		defer done()
		_ = srv.Shutdown(sctx) // the streams end with the context; a slow one is cut at the deadline
		srv.Close()
	}, nil
}
