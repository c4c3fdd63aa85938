package unixapi_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// infoFields splits an INFO line into its name=value fields.
func infoFields(t *testing.T, line string) map[string]string {
	t.Helper()
	rest, ok := strings.CutPrefix(line, "INFO ")
	if !ok {
		t.Fatalf("not an INFO line: %q", line)
	}
	f := map[string]string{}
	for _, w := range strings.Split(rest, " ") {
		name, value, ok := strings.Cut(w, "=")
		if !ok {
			t.Fatalf("INFO field %q without '=' in %q", w, line)
		}
		f[name] = value
	}
	return f
}

// INFO shows the broker's cluster session, on real nodes of version 7:
// its id (hex, as the sidecar logs it), state, timeout and opens once it
// is attached; after the leader's kill, the resume and what it said about
// a waiter queued through this socket (still queued), which is then
// granted when the holder releases: the line survived, and INFO tells.
// A broker with sessions off says so and shows no session.
func TestInfoShowsSession(t *testing.T) {
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: testLogger(), Tune: func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		cfg.ProtocolVersion = 7
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	newServer := func(tune func(*sidecar.Config)) (*sidecar.Broker, *unixapi.Server) {
		cfg := sidecar.DefaultConfig()
		cfg.Addrs, cfg.Secret, cfg.ClusterID, cfg.Logger = c.ClientAddrs(), c.ClientSecret, c.ClusterID, testLogger()
		tune(&cfg)
		b, err := sidecar.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ucfg := unixapi.DefaultConfig()
		ucfg.Path, ucfg.Logger = sockPath(t), testLogger()
		s, err := unixapi.Listen(ucfg, b)
		if err != nil {
			b.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(); b.Close() })
		return b, s
	}

	off, offSrv := newServer(func(cfg *sidecar.Config) { cfg.Sessions = sidecar.SessionsOff })
	testkit.WaitFor(t, "the session-less broker to learn a leader", 30*time.Second, func() bool { return off.Info().Leader != "" })
	f := infoFields(t, dial(t, offSrv).do("INFO"))
	if f["sessions"] != "off" || f["session"] != "-" || f["session_state"] != "-" || f["session_timeout_ms"] != "10000" ||
		f["session_opens"] != "0" || f["session_resumes"] != "0" {
		t.Fatalf("sessions off: INFO fields %v", f)
	}

	b, s := newServer(func(cfg *sidecar.Config) { cfg.SessionTimeout = 7 * time.Second })
	ic := dial(t, s)
	testkit.WaitFor(t, "INFO to show the session attached", 30*time.Second, func() bool {
		return infoFields(t, ic.do("INFO"))["session_state"] == "attached"
	})
	f = infoFields(t, ic.do("INFO"))
	si := b.Info().Session
	if si == nil || f["sessions"] != "auto" || f["session"] != strconv.FormatUint(si.ID, 16) || f["session_timeout_ms"] != "7000" ||
		f["session_opens"] != "1" || f["session_resumes"] != "0" || f["session_held"] != "0" ||
		f["session_last_resume"] != "outcomes:0,queued:0,void:0,repeated:0" {
		t.Fatalf("attached: INFO fields %v (broker's session %+v)", f, si)
	}
	id := f["session"]

	k := key(t)
	a := dial(t, s)
	tok := token(t, a.do("ACQUIRE "+k+" 60 0"))
	w := dial(t, s)
	w.send("HELLO 4 events", "ACQUIRE "+k+" 60 45")
	expect(t, w.read(), "HELLO 4 events")
	expect(t, w.read(), "! QUEUED 2 "+k)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	li, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "INFO to show the session resumed", 45*time.Second, func() bool {
		f = infoFields(t, ic.do("INFO"))
		return f["session_state"] == "attached" && f["session_resumes"] != "0"
	})
	if f["session"] != id || f["session_resumes"] != "1" || f["session_opens"] != "1" || f["session_held"] != "0" ||
		!strings.Contains(f["session_last_resume"], ",queued:1,") {
		t.Fatalf("resumed: INFO fields %v, want session %s resumed once with the waiter still queued", f, id)
	}
	expect(t, a.do(fmt.Sprintf("RELEASE %s %d", k, tok)), "OK")
	if t2 := token(t, w.read()); t2 <= tok {
		t.Fatalf("waiter granted token %d after the holder's %d", t2, tok)
	}
}
