package cli

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
)

// pprofFlag serves Go's profiler (net/http/pprof) for profiling a running
// node or sidecar: `go tool pprof http://ADDR/debug/pprof/profile`. It has
// no authentication, so only loopback addresses are accepted.
type pprofFlag struct{ addr string }

func (p *pprofFlag) register(fs *flag.FlagSet) {
	fs.StringVar(&p.addr, "pprof-addr", "", "loopback HOST:PORT to serve /debug/pprof on (CPU, heap, mutex and block profiles; default: off)")
}

// start serves the profiler if asked; it returns a func that stops it.
func (p *pprofFlag) start(log *slog.Logger) (stop func(), err error) {
	if p.addr == "" {
		return func() {}, nil
	}
	host, _, err := net.SplitHostPort(p.addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof-addr %q: %w", p.addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("--pprof-addr %q: the profiler is unauthenticated; give a loopback address", p.addr)
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof-addr: %w", err)
	}
	// Sample contention too, so the mutex and block profiles say something.
	runtime.SetMutexProfileFraction(100)
	runtime.SetBlockProfileRate(100_000) // one event per 100 µs blocked
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Warn("profiler stopped", "err", err)
		}
	}()
	log.Info("profiler listening", "addr", ln.Addr().String())
	return func() { srv.Close() }, nil
}
