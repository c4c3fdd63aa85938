package cli

import (
	"flag"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"ticketing/cluster/obs"
)

// metricsFlag serves Prometheus metrics and the health checks (/metrics,
// /healthz, /readyz) of a node or sidecar; see cluster/obs.
type metricsFlag struct{ addr string }

func (m *metricsFlag) register(fs *flag.FlagSet) {
	fs.StringVar(&m.addr, "metrics-addr", "", "HOST:PORT to serve Prometheus /metrics and the /healthz and /readyz checks on "+
		"(unauthenticated and read-only: keep it on a private interface; default: off)")
}

// start serves the listener if asked (nil, nil if not).
func (m *metricsFlag) start(g prometheus.Gatherer, ready func() error, log *slog.Logger) (*obs.Server, error) {
	if m.addr == "" {
		return nil, nil
	}
	return obs.Listen(obs.Options{Addr: m.addr, Gatherer: g, Ready: ready, Logger: log.With("part", "metrics")})
}
