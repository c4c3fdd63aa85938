package obs

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestListenServesMetricsAndHealth(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketing_test_things_total", Help: "Things."})
	reg.MustRegister(c)
	c.Add(3)
	var notReady atomic.Bool
	s, err := Listen(Options{Addr: "127.0.0.1:0", Gatherer: reg, Logger: slog.New(slog.DiscardHandler), Ready: func() error {
		if notReady.Load() {
			return errors.New("no known leader")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Handle("/v1/status", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `{"ok":true}`) }))
	base := "http://" + s.Addr()
	get := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("GET", "/metrics"); code != 200 || !strings.Contains(body, "ticketing_test_things_total 3") ||
		!strings.Contains(body, "go_goroutines") || !strings.Contains(body, "process_start_time_seconds") {
		t.Errorf("/metrics: %d\n%s", code, body)
	}
	if code, body := get("GET", "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get("GET", "/readyz"); code != 200 || body != "ok\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	notReady.Store(true)
	if code, body := get("GET", "/readyz"); code != 503 || body != "not ready: no known leader\n" {
		t.Errorf("/readyz not ready: %d %q", code, body)
	}
	if code, body := get("HEAD", "/readyz"); code != 503 || body != "" {
		t.Errorf("HEAD /readyz: %d %q", code, body)
	}
	if code, _ := get("POST", "/healthz"); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz: %d", code)
	}
	if code, body := get("GET", "/v1/status"); code != 200 || body != `{"ok":true}` {
		t.Errorf("/v1/status: %d %q", code, body)
	}
	if code, _ := get("GET", "/nothing"); code != 404 {
		t.Errorf("/nothing: %d", code)
	}
}
