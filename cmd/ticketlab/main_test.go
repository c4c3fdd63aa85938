package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"ticketing/cluster"
	"ticketing/cmd/ticketlab/internal/compare"
	"ticketing/cmd/ticketlab/internal/labtest"
	"ticketing/sidecar"
)

var (
	binOnce           sync.Once
	ticketingBin, lab string
	binErr            error
	cleanups          []func()
)

// binaries builds (once) the ticketing binary under test and this lab
// binary, or takes them from $TICKETING_BIN and $TICKETLAB_BIN.
func binaries(t *testing.T) (ticketing, ticketlab string) {
	t.Helper()
	binOnce.Do(func() {
		var c1, c2 func()
		if ticketingBin, c1, binErr = labtest.Ticketing(); binErr != nil {
			return
		}
		cleanups = append(cleanups, c1)
		if lab, c2, binErr = labtest.Lab(); binErr != nil {
			return
		}
		cleanups = append(cleanups, c2)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return ticketingBin, lab
}

func TestMain(m *testing.M) {
	compare.ServeLineFloorIfAsked()
	code := m.Run()
	for _, c := range cleanups {
		c()
	}
	os.Exit(code)
}

func run(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = Main(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// -h anywhere prints the usage to stdout and exits 0; a bad invocation
// exits 2 with a one-line reason first, on stderr.
func TestUsageConventions(t *testing.T) {
	for _, args := range [][]string{
		{"-h"}, {"--help"}, {"help"},
		{"bench", "--help"}, {"bench", "-h"}, {"bench", "help"},
		{"bench", "failover", "-h"}, {"bench", "handover", "--help"}, {"bench", "throughput", "-h"},
		{"bench", "unix", "-h"}, {"bench", "unixconns", "-h"}, {"bench", "catchup", "-h"},
		{"bench", "scale", "-h"}, {"bench", "disk", "-h"}, {"bench", "isolation", "-h"}, {"bench", "waitroom", "-h"},
		{"bench", "blocks", "-h"}, {"bench", "linekill", "-h"},
		{"verify", "-h"}, {"verify", "worker", "-h"}, {"compare", "-h"},
	} {
		code, out, errs := run(args...)
		if code != 0 || !strings.Contains(out, "usage: ticketlab") || errs != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want the usage on stdout and exit 0", args, code, out, errs)
		}
	}
	for _, c := range []struct {
		args []string
		why  string
	}{
		{nil, "ticketlab: name a command"},
		{[]string{"bogus"}, `ticketlab: unknown command "bogus"`},
		{[]string{"bench"}, "ticketlab bench: name a benchmark"},
		{[]string{"bench", "--kills", "3"}, `ticketlab bench: unknown benchmark "--kills"`},
		{[]string{"bench", "bogus"}, `ticketlab bench: unknown benchmark "bogus"`},
		{[]string{"bench", "disk", "--kills", "3"}, "ticketlab bench disk: flag provided but not defined: -kills"},
		{[]string{"bench", "failover", "--signal", "hup", "--binary", os.Args[0]}, `ticketlab bench failover: --signal "hup": want kill or term`},
		{[]string{"bench", "failover", "--nodes", "4", "--binary", os.Args[0]}, "ticketlab bench failover: --nodes 4: want 3 or 5"},
		{[]string{"bench", "isolation", "--cases", "bogus", "--binary", os.Args[0]}, `ticketlab bench isolation: --cases "bogus": want some of flood, slowread, releases, idle`},
		{[]string{"bench", "waitroom", "--waiters", "0", "--binary", os.Args[0]}, "ticketlab bench waitroom: --waiters, --per-conn, --baseline-waiters: want at least 1"},
		{[]string{"bench", "blocks", "--block", "1", "--binary", os.Args[0]}, "ticketlab bench blocks: --block 1: want 2..16"},
		{[]string{"bench", "blocks", "--zipf", "1", "--binary", os.Args[0]}, "ticketlab bench blocks: --zipf 1: want more than 1"},
		{[]string{"bench", "linekill", "--waiters", "5", "--kill-after", "5", "--binary", os.Args[0]}, "ticketlab bench linekill: want --waiters ≥ 1, 0 ≤ --kill-after < --waiters"},
		{[]string{"bench", "throughput", "extra"}, `ticketlab bench throughput: unexpected arguments ["extra"]`},
		{[]string{"verify", "--nodes"}, "ticketlab verify: flag needs an argument: -nodes"},
		{[]string{"compare", "--clients", "0"}, `ticketlab compare: --clients "0": want counts in 1..4096`},
		{[]string{"bench", "failover", "--binary", "/nonexistent/ticketing"}, "ticketlab bench failover: --binary: stat /nonexistent/ticketing"},
	} {
		code, out, errs := run(c.args...)
		first, _, _ := strings.Cut(errs, "\n")
		if code != 2 || !strings.HasPrefix(first, c.why) || !strings.Contains(errs, "usage: ticketlab") || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q before the usage on stderr", c.args, code, out, errs, c.why)
		}
	}
}

// Without --fault-file, `ticketlab node` and `ticketlab sidecar` are the
// product's commands: nothing is plugged into the seams (the hot path is
// the plain connection).
func TestNoFaultFileNoFaults(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	no := nodeOptions()
	no.Flags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	var cfg cluster.Config
	log := slog.New(slog.DiscardHandler)
	if err := no.Setup(context.Background(), &cfg, log); err != nil || cfg.PeerNet != nil || cfg.Now != nil {
		t.Fatalf("node: %v; peer net %v, clock set %v", err, cfg.PeerNet, cfg.Now != nil)
	}
	fs = flag.NewFlagSet("y", flag.ContinueOnError)
	so := sidecarOptions()
	so.Flags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	var scfg sidecar.Config
	if err := so.Setup(context.Background(), &scfg, log); err != nil || scfg.Dialer != nil {
		t.Fatalf("sidecar: %v; dialer set %v", err, scfg.Dialer != nil)
	}
}

// A fault file that does not parse keeps `ticketlab node` from starting.
func TestNodeRefusesBadFaultFile(t *testing.T) {
	dir := t.TempDir()
	secret := dir + "/s"
	peer := dir + "/p"
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(peer, []byte("fedcba9876543210fedcba9876543210\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/f.json", []byte(`{"cut": [["n1"]], "bogus": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	code := runNode(context.Background(), []string{"--id", "n1", "--data-dir", dir + "/d", "--client-addr", "127.0.0.1:0",
		"--peer-addr", "127.0.0.1:0", "--secret-file", secret, "--peer-secret-file", peer, "--fault-file", dir + "/f.json"},
		io.Discard, &errb)
	if code != 2 || !strings.Contains(errb.String(), "bad fault file") {
		t.Fatalf("exit %d, stderr %q; want 2 and the bad fault file named", code, errb.String())
	}
	if _, err := os.Stat(dir + "/d"); err == nil {
		t.Fatal("the node touched its data dir before refusing")
	}
}
