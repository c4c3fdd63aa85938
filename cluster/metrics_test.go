package cluster_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/obs"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// metric returns the value of the series name{labels} in g (a counter's
// or gauge's value, a histogram's sample count), failing the test if it is
// missing. labels are name, value pairs.
func metric(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok := lookupMetric(t, g, name, labels...)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

func lookupMetric(t *testing.T, g prometheus.Gatherer, name string, labels ...string) (float64, bool) {
	t.Helper()
	v, ok, err := obs.Value(g, name, labels...)
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	return v, ok
}

func wantMetric(t *testing.T, g prometheus.Gatherer, want float64, name string, labels ...string) {
	t.Helper()
	if got := metric(t, g, name, labels...); got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// Metrics change as expected under a small workload: a grant, a busy, a
// timeout, a hand-off by release, a stale release, a refusal by a limit, a
// hand-off by lease expiry, a moved reply from a follower, a failed
// authentication and a snapshot.
func TestMetricsUnderSmallWorkload(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) { cfg.MaxWaitersPerKey = 1 }})
	li := c.leader()
	ln := c.Node(li)
	reg := ln.MetricsRegistry()
	a, b, d := c.dial(li), c.dial(li), c.dial(li)

	wantMetric(t, reg, 1, "ticketing_node_raft_state", "state", "leader")
	wantMetric(t, reg, 0, "ticketing_node_raft_state", "state", "follower")
	wantMetric(t, reg, 1, "ticketing_node_serving")
	wantMetric(t, reg, 0, "ticketing_node_acquires_total", "result", "granted")

	t1 := mustGrant(t, do(t, a, acquireMsg("k", "alice", 30, 0)))
	mustType(t, do(t, b, acquireMsg("k", "bob", 30, 0)), wire.TypeBusy)
	mustType(t, do(t, b, acquireMsg("k", "bob", 30, 100*time.Millisecond)), wire.TypeTimeout)

	// bob waits; a second waiter is over MaxWaitersPerKey; alice's
	// release hands k to bob.
	call, err := b.Start(acquireMsg("k", "bob", 30, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "bob queued", 5*time.Second, func() bool {
		v, _ := lookupMetric(t, reg, "ticketing_node_waiters")
		return v == 1
	})
	r := do(t, d, acquireMsg("k", "dave", 30, time.Second))
	if r.Type != wire.TypeError || r.Code != wire.CodeTooManyWaiters {
		t.Fatalf("second waiter: %s", describe(r))
	}
	wantMetric(t, reg, 1, "ticketing_node_keys_held")
	wantMetric(t, reg, 1, "ticketing_node_pending_requests")
	mustType(t, do(t, a, releaseMsg("k", "alice", t1)), wire.TypeOK)
	<-call.Done
	if call.Err != nil {
		t.Fatal(call.Err)
	}
	t2 := mustGrant(t, call.Reply)
	r = do(t, a, releaseMsg("k", "alice", t1)) // stale
	if r.Type != wire.TypeError || r.Code != wire.CodeNotHeld {
		t.Fatalf("stale release: %s", describe(r))
	}

	// A 1 s lease runs out with dave waiting: a hand-off by expiry.
	mustGrant(t, do(t, a, acquireMsg("e", "crashed", 1, 0)))
	t4 := mustGrant(t, do(t, d, acquireMsg("e", "dave", 30, 5*time.Second)))

	wantMetric(t, reg, 4, "ticketing_node_acquires_total", "result", "granted")
	wantMetric(t, reg, 1, "ticketing_node_acquires_total", "result", "busy")
	wantMetric(t, reg, 1, "ticketing_node_acquires_total", "result", "timeout")
	wantMetric(t, reg, 1, "ticketing_node_acquires_total", "result", "error")
	wantMetric(t, reg, 0, "ticketing_node_acquires_total", "result", "indeterminate")
	wantMetric(t, reg, 0, "ticketing_node_acquires_total", "result", "moved")
	wantMetric(t, reg, 1, "ticketing_node_releases_total", "result", "ok")
	wantMetric(t, reg, 1, "ticketing_node_releases_total", "result", "not_held")
	wantMetric(t, reg, 0, "ticketing_node_releases_total", "result", "error")
	wantMetric(t, reg, 2, "ticketing_node_handoffs_total")
	wantMetric(t, reg, 1, "ticketing_node_expiries_total")
	wantMetric(t, reg, 0, "ticketing_node_abandoned_grants_total")
	wantMetric(t, reg, 2, "ticketing_node_acquire_duration_seconds", "queued", "false")
	wantMetric(t, reg, 2, "ticketing_node_acquire_duration_seconds", "queued", "true")
	wantMetric(t, reg, 2, "ticketing_node_handoff_duration_seconds")
	wantMetric(t, reg, 1, "ticketing_node_limit_refusals_total", "limit", "waiters_per_key")
	wantMetric(t, reg, 0, "ticketing_node_limit_refusals_total", "limit", "keys")

	// The gauges read the state: k held by bob, e by dave, nobody waits.
	wantMetric(t, reg, 2, "ticketing_node_keys_held")
	wantMetric(t, reg, 0, "ticketing_node_waiters")
	wantMetric(t, reg, 0, "ticketing_node_pending_requests")
	wantMetric(t, reg, float64(t4), "ticketing_node_last_token")
	if t4 <= t2 || float64(ln.LastToken()) != float64(t4) {
		t.Errorf("tokens %d, %d; node's last %d", t2, t4, ln.LastToken())
	}
	wantMetric(t, reg, 3, "ticketing_node_client_connections")
	wantMetric(t, reg, 3, "ticketing_node_raft_members", "suffrage", "voter")
	if v := metric(t, reg, "ticketing_node_leader_changes_total"); v < 1 {
		t.Errorf("leader changes %v", v)
	}
	commit, applied := metric(t, reg, "ticketing_node_raft_commit_index"), metric(t, reg, "ticketing_node_raft_applied_index")
	if commit < 5 || applied > commit || metric(t, reg, "ticketing_node_raft_term") < 1 {
		t.Errorf("commit %v applied %v", commit, applied)
	}

	// A follower answers M and counts it; it knows the leader and the
	// lock table as replicated.
	fi := (li + 1) % 3
	freg := c.Node(fi).MetricsRegistry()
	mustType(t, do(t, c.dial(fi), acquireMsg("k", "x", 30, 0)), wire.TypeMoved)
	wantMetric(t, freg, 1, "ticketing_node_acquires_total", "result", "moved")
	wantMetric(t, freg, 0, "ticketing_node_acquires_total", "result", "granted")
	wantMetric(t, freg, 0, "ticketing_node_handoffs_total") // counted by the leader only
	wantMetric(t, freg, 1, "ticketing_node_raft_state", "state", "follower")
	wantMetric(t, freg, 1, "ticketing_node_raft_leader_known")
	testkit.WaitFor(t, "follower applied the last grant", 5*time.Second, func() bool {
		v, _ := lookupMetric(t, freg, "ticketing_node_last_token")
		return v == float64(t4)
	})
	wantMetric(t, freg, 2, "ticketing_node_keys_held")

	// A client with the wrong secret fails admission.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cn, err := client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: []byte("not-the-secret-0123456789"), ClusterID: c.ClusterID}); err == nil {
		cn.Close()
		t.Fatal("dial with a wrong secret succeeded")
	}
	testkit.WaitFor(t, "auth failure counted", 5*time.Second, func() bool {
		v, _ := lookupMetric(t, reg, "ticketing_node_auth_failures_total", "port", "client")
		return v == 1
	})
	wantMetric(t, reg, 0, "ticketing_node_auth_failures_total", "port", "peer")

	// A snapshot shows in the snapshot metrics.
	wantMetric(t, reg, 0, "ticketing_node_snapshots_total")
	if err := ln.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	wantMetric(t, reg, 1, "ticketing_node_snapshots_total")
	if size := metric(t, reg, "ticketing_node_snapshot_size_bytes"); size <= 0 {
		t.Errorf("snapshot size %v", size)
	}
	if idx := metric(t, reg, "ticketing_node_snapshot_index"); idx < 5 {
		t.Errorf("snapshot index %v", idx)
	}

	// The other nodes' registries are their own.
	if v, _ := lookupMetric(t, c.Node((li+2)%3).MetricsRegistry(), "ticketing_node_acquires_total", "result", "granted"); v != 0 {
		t.Errorf("a third node counted %v grants", v)
	}
	var st locksm.Holder
	ln.ReadState(func(s *locksm.State) { st, _ = s.Holder("k") })
	if st.Token != t2 {
		t.Errorf("k held under %d", st.Token)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// The metrics listener serves /metrics, /healthz and /readyz: ready on the
// leader and on a follower, not ready on a node outside any configuration.
func TestMetricsListenerAndReadiness(t *testing.T) {
	c := startClusterOpts(t, local.Options{Nodes: 4, Voters: 3})
	li := c.leader()
	fi := (li + 1) % 3
	const spare = 3
	serve := func(i int) string {
		n := c.Node(i)
		s, err := obs.Listen(obs.Options{Addr: "127.0.0.1:0", Gatherer: n.MetricsRegistry(), Ready: n.Ready, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		s.Handle("/v1/extra", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "extra") }))
		return "http://" + s.Addr()
	}
	lu, fu, su := serve(li), serve(fi), serve(spare)

	code, body := httpGet(t, lu+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, name := range []string{
		"ticketing_node_acquires_total{result=\"granted\"} 0", "ticketing_node_releases_total",
		"ticketing_node_expiries_total", "ticketing_node_handoffs_total", "ticketing_node_acquire_duration_seconds_bucket",
		"ticketing_node_handoff_duration_seconds_bucket", "ticketing_node_keys_held", "ticketing_node_waiters",
		"ticketing_node_last_token", "ticketing_node_raft_state{state=\"leader\"} 1", "ticketing_node_raft_term",
		"ticketing_node_raft_commit_index", "ticketing_node_raft_applied_index", "ticketing_node_leader_changes_total",
		"ticketing_node_snapshot_size_bytes", "ticketing_node_auth_failures_total{port=\"peer\"} 0",
		"ticketing_node_limit_refusals_total{limit=\"keys\"} 0", "ticketing_node_client_connections",
		"ticketing_node_serving 1", "go_goroutines", "process_",
	} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %q", name)
		}
	}
	if code, body := httpGet(t, lu+"/healthz"); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz on the leader: %d %q", code, body)
	}
	if code, body := httpGet(t, lu+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz on the leader: %d %q", code, body)
	}
	testkit.WaitFor(t, "follower ready", 5*time.Second, func() bool { return c.Node(fi).Ready() == nil })
	if code, body := httpGet(t, fu+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz on a follower: %d %q", code, body)
	}
	if code, body := httpGet(t, su+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not part of a cluster") {
		t.Errorf("/readyz on a node outside any configuration: %d %q", code, body)
	}
	if code, _ := httpGet(t, su+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz on the spare node: %d", code)
	}
	if code, body := httpGet(t, su+"/v1/extra"); code != http.StatusOK || body != "extra" {
		t.Errorf("extra handler: %d %q", code, body)
	}
	// The spare node's metrics say it is not in a configuration.
	sreg := c.Node(spare).MetricsRegistry()
	wantMetric(t, sreg, 0, "ticketing_node_raft_members", "suffrage", "voter")
	wantMetric(t, sreg, 0, "ticketing_node_raft_leader_known")

	// A closed node is not ready.
	if err := c.Stop(fi); err != nil {
		t.Fatal(err)
	}
	if code, body := httpGet(t, fu+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "closed") {
		t.Errorf("/readyz on a closed node: %d %q", code, body)
	}
}

// The status and inspection reports are served as JSON beside the metrics.
func TestReportHandlerJSON(t *testing.T) {
	c := startCluster(t, 3)
	li := c.leader()
	lc := c.client()
	defer lc.close()
	tok := mustGrant(t, lc.do(acquireMsg("seat/1", "alice", 60, 0)))
	s, err := obs.Listen(obs.Options{Addr: "127.0.0.1:0", Gatherer: c.Node(li).MetricsRegistry(), Ready: c.Node(li).Ready, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.Handle("/v1/", c.Node(li).ReportHandler())
	u := "http://" + s.Addr()

	code, body := httpGet(t, u+"/v1/status")
	var st wire.StatusReport
	if err := json.Unmarshal([]byte(body), &st); code != http.StatusOK || err != nil {
		t.Fatalf("/v1/status: %d %v %s", code, err, body)
	}
	if st.ServerID != c.Node(li).ServerID() || st.KeysHeld != 1 || st.LastToken != tok || len(st.Members) != 3 {
		t.Fatalf("/v1/status: %+v", st)
	}
	code, body = httpGet(t, u+"/v1/keys/seat/1")
	var kr wire.KeyReport
	if err := json.Unmarshal([]byte(body), &kr); code != http.StatusOK || err != nil {
		t.Fatalf("/v1/keys/seat/1: %d %v %s", code, err, body)
	}
	if !kr.Held || kr.Holder == nil || kr.Holder.Owner != "alice" || kr.Holder.Token != tok {
		t.Fatalf("/v1/keys/seat/1: %s", body)
	}
	if code, body := httpGet(t, u+"/v1/keys/free"); code != http.StatusOK || !strings.Contains(body, `"held": false`) {
		t.Fatalf("/v1/keys/free: %d %s", code, body)
	}
	if code, _ := httpGet(t, u+"/v1/keys/bad%20key"); code != http.StatusBadRequest {
		t.Fatalf("/v1/keys/ with an invalid key: %d, want 400", code)
	}
}
