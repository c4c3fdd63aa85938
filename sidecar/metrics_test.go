package sidecar

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"ticketing/cluster/obs"
	"ticketing/cluster/testkit"
	"ticketing/locksm"
)

// metricValue is the value of name{labels} in g (a histogram's sample
// count); labels are name, value pairs.
func metricValue(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok, err := obs.Value(g, name, labels...)
	if err != nil || !ok {
		t.Fatalf("no series %s%v (%v)", name, labels, err)
	}
	return v
}

func wantValue(t *testing.T, g prometheus.Gatherer, want float64, name string, labels ...string) {
	t.Helper()
	if got := metricValue(t, g, name, labels...); got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

func TestBrokerMetricsAndReadiness(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	reg := b.MetricsRegistry()
	ctx := ctxT(t, 30*time.Second)

	lk, err := b.Acquire(ctx, "k", "alice", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "k", "bob", 30*time.Second, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("busy: %v", err)
	}
	if _, err := b.Acquire(ctx, "k", "bob", 30*time.Second, 100*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("timeout: %v", err)
	}
	if _, err := b.Acquire(ctx, "", "bob", 30*time.Second, 0); !errors.Is(err, locksm.ErrInvalidKey) {
		t.Fatalf("invalid key: %v", err)
	}
	if err := b.Release(ctx, lk); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, lk); !errors.Is(err, locksm.ErrNotHeld) {
		t.Fatalf("second release: %v", err)
	}
	held, err := b.Acquire(ctx, "gone", "carol", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	b.Compensate(held)
	testkit.WaitFor(t, "compensation counted", 5*time.Second, func() bool {
		return metricValue(t, reg, "ticketing_sidecar_compensations_total", "result", "ok") == 1
	})

	wantValue(t, reg, 2, "ticketing_sidecar_acquires_total", "result", "granted")
	wantValue(t, reg, 1, "ticketing_sidecar_acquires_total", "result", "busy")
	wantValue(t, reg, 1, "ticketing_sidecar_acquires_total", "result", "timeout")
	wantValue(t, reg, 1, "ticketing_sidecar_acquires_total", "result", "error")
	wantValue(t, reg, 0, "ticketing_sidecar_acquires_total", "result", "indeterminate")
	wantValue(t, reg, 0, "ticketing_sidecar_acquires_total", "result", "unavailable")
	wantValue(t, reg, 2, "ticketing_sidecar_acquire_duration_seconds")
	wantValue(t, reg, 1, "ticketing_sidecar_releases_total", "result", "ok")
	wantValue(t, reg, 1, "ticketing_sidecar_releases_total", "result", "not_held")
	wantValue(t, reg, 0, "ticketing_sidecar_releases_total", "result", "indeterminate")
	wantValue(t, reg, 1, "ticketing_sidecar_release_duration_seconds")
	wantValue(t, reg, 0, "ticketing_sidecar_late_grants_total")
	wantValue(t, reg, 3, "ticketing_sidecar_connected_nodes")
	wantValue(t, reg, 3, "ticketing_sidecar_configured_nodes")
	wantValue(t, reg, 1, "ticketing_sidecar_leader_known")
	wantValue(t, reg, 0, "ticketing_sidecar_release_queue")
	if v := metricValue(t, reg, "ticketing_sidecar_leader_changes_total"); v < 1 {
		t.Errorf("leader changes %v", v)
	}
	if _, ok := holder(c, leaderOf(t, c), "gone"); ok {
		t.Error("the compensated lock is still held")
	}

	s, err := obs.Listen(obs.Options{Addr: "127.0.0.1:0", Gatherer: reg, Ready: b.Ready, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	code, body := get(t, "http://"+s.Addr()+"/readyz")
	if code != http.StatusOK {
		t.Errorf("/readyz: %d %q", code, body)
	}
	code, body = get(t, "http://"+s.Addr()+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, `ticketing_sidecar_acquires_total{result="granted"} 2`) {
		t.Errorf("/metrics: %d\n%s", code, body)
	}
}

// A broker that reaches no node is not ready, and its acquires are
// counted unavailable.
func TestBrokerNotReadyWithoutCluster(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	cfg := DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.Logger = []string{addr}, []byte("0123456789abcdef0123"), testLogger()
	cfg.LeaderWait = 100 * time.Millisecond
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Acquire(ctxT(t, 5*time.Second), "k", "o", time.Second, 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire: %v, want ErrUnavailable", err)
	}
	reg := b.MetricsRegistry()
	wantValue(t, reg, 1, "ticketing_sidecar_acquires_total", "result", "unavailable")
	wantValue(t, reg, 0, "ticketing_sidecar_connected_nodes")
	wantValue(t, reg, 0, "ticketing_sidecar_leader_known")
	testkit.WaitFor(t, "a failed connect counted", 5*time.Second, func() bool {
		return metricValue(t, reg, "ticketing_sidecar_connect_failures_total") >= 1
	})
	s, err := obs.Listen(obs.Options{Addr: "127.0.0.1:0", Gatherer: reg, Ready: b.Ready, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if code, body := get(t, "http://"+s.Addr()+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no connection") {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if code, _ := get(t, "http://"+s.Addr()+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
