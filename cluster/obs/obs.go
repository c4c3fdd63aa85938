// Package obs serves a process's observability endpoints on one HTTP
// listener: Prometheus metrics (/metrics) and the health checks load
// balancers and orchestrators probe (/healthz, /readyz). Both `ticketing
// node` and `ticketing sidecar` use it (--metrics-addr).
//
// The listener is read-only and unauthenticated: put it on a private
// interface (loopback, or the network the scraper lives on). Listen logs a
// warning when the address is not a loopback one.
package obs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// LatencyBuckets are the histogram buckets (seconds) of the request
// latencies: 100 µs to an hour, the longest wait an acquire may ask for
// (5 minutes before protocol version 11; the buckets up to 300 s are
// unchanged, so dashboards built on them keep their meaning).
var LatencyBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600,
}

// Options configure Listen.
type Options struct {
	// Addr is the HOST:PORT to listen on (":0" or "127.0.0.1:0" picks a
	// port). Ignored when Listener is set.
	Addr     string
	Listener net.Listener
	// Gatherer is what /metrics serves (a Node's or Broker's registry).
	// The Go runtime and process collectors are added to it.
	Gatherer prometheus.Gatherer
	// Ready says whether the process should receive traffic: nil for
	// ready, else the reason it is not (one line, served with 503).
	// nil Ready: always ready.
	Ready func() error
	// Logger; nil: slog.Default().
	Logger *slog.Logger
}

// Server is a running observability listener.
type Server struct {
	ln  net.Listener
	mux *http.ServeMux
	srv *http.Server
	log *slog.Logger
	// done is closed when Serve returns.
	done chan struct{}
}

// Listen starts serving /metrics, /healthz and /readyz on opts.Addr.
func Listen(opts Options) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	ln := opts.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", opts.Addr); err != nil {
			return nil, fmt.Errorf("metrics listener: %w", err)
		}
	}
	if !isLoopback(ln.Addr()) {
		log.Warn("the metrics listener is unauthenticated and serves on a non-loopback address; "+
			"keep it on a private network", "addr", ln.Addr().String())
	}
	proc := prometheus.NewRegistry()
	proc.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	gs := prometheus.Gatherers{proc}
	if opts.Gatherer != nil {
		gs = append(gs, opts.Gatherer)
	}
	s := &Server{ln: ln, mux: http.NewServeMux(), log: log, done: make(chan struct{})}
	s.mux.Handle("/metrics", promhttp.HandlerFor(gs, promhttp.HandlerOpts{
		ErrorLog:            slogErrorLog{log},
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	}))
	s.mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeText(w, r, http.StatusOK, "ok")
	})
	ready := opts.Ready
	s.mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				writeText(w, r, http.StatusServiceUnavailable, "not ready: "+err.Error())
				return
			}
		}
		writeText(w, r, http.StatusOK, "ok")
	})
	s.srv = &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener stopped", "err", err)
		}
	}()
	log.Info("metrics listening", "addr", ln.Addr().String(), "paths", "/metrics /healthz /readyz")
	return s, nil
}

// Handle adds a handler (for example a JSON status page) to the listener;
// safe while it serves.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Addr is the address the listener is bound to.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the listener, letting requests in progress finish for up to
// a second.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = s.srv.Close()
	}
	<-s.done
	return err
}

func writeText(w http.ResponseWriter, r *http.Request, code int, body string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if r.Method == http.MethodGet {
		_, _ = fmt.Fprintln(w, body) // a failed write means the scraper went away: nobody left to tell
	}
}

// isLoopback reports a listener address on a loopback IP (not the
// unspecified address, which listens on every interface).
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// slogErrorLog adapts slog to promhttp's error logger.
type slogErrorLog struct{ log *slog.Logger }

func (l slogErrorLog) Println(v ...interface{}) {
	l.log.Warn("metrics: " + fmt.Sprint(v...))
}

// Value returns the value of the first series of the metric name whose
// labels include the given name, value pairs: a counter's or gauge's
// value, a histogram's sample count. ok is false when there is no such
// series. For tests and tools reading a registry directly.
func Value(g prometheus.Gatherer, name string, labels ...string) (v float64, ok bool, err error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, false, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
				}
				if !found {
					continue series
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue(), true, nil
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue(), true, nil
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount()), true, nil
			}
		}
	}
	return 0, false, nil
}
