package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
)

func secretFile(t *testing.T, dir, name string) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Plaintext beyond loopback needs an explicit flag: a node or sidecar
// that would silently expose lock traffic refuses to start.
func TestPlaintextRefusedBeyondLoopback(t *testing.T) {
	dir := t.TempDir()
	sec, peer := secretFile(t, dir, "c.secret"), secretFile(t, dir, "p.secret")
	var out, errb bytes.Buffer
	code := Main([]string{"node", "--id", "n1", "--data-dir", filepath.Join(dir, "d"),
		"--client-addr", "0.0.0.0:0", "--peer-addr", "10.1.2.3:7500",
		"--peers", "n1=10.1.2.3:7500,n2=10.1.2.4:7500,n3=10.1.2.5:7500",
		"--secret-file", sec, "--peer-secret-file", peer}, &out, &errb)
	if code != ExitUsage || !strings.Contains(errb.String(), "--insecure-plaintext") {
		t.Fatalf("node without TLS on 0.0.0.0: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	code = Main([]string{"sidecar", "--cluster", "10.1.2.3:7400,10.1.2.4:7400", "--secret-file", sec,
		"--socket", filepath.Join(dir, "s.sock")}, &out, &errb)
	if code != ExitUsage || !strings.Contains(errb.String(), "--insecure-plaintext") {
		t.Fatalf("sidecar without TLS to remote nodes: exit %d, stderr %q", code, errb.String())
	}
	if !isLoopback("127.0.0.1:7400") || !isLoopback("[::1]:1") || !isLoopback("localhost:1") || isLoopback(":7400") || isLoopback("10.0.0.1:1") {
		t.Fatal("isLoopback")
	}
}

func TestCertsCommand(t *testing.T) {
	dir := t.TempDir()
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := Main(append([]string{"certs"}, args...), &out, &errb)
		return code, out.String() + errb.String()
	}
	if code, msg := run("node", "--dir", dir, "--id", "n1"); code != ExitError || !strings.Contains(msg, "certs ca") {
		t.Fatalf("node cert without a CA: %d %q", code, msg)
	}
	for _, args := range [][]string{
		{"ca", "--dir", dir},
		{"node", "--dir", dir, "--id", "n1", "--host", "10.0.0.1,node1.example"},
		{"client", "--dir", dir, "--name", "web1"},
	} {
		if code, msg := run(args...); code != ExitOK {
			t.Fatalf("certs %v: %d %q", args, code, msg)
		}
	}
	for _, name := range []string{"ca", "n1", "web1"} {
		fi, err := os.Stat(filepath.Join(dir, name+".key"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s.key: %v %v", name, fi, err)
		}
	}
	// Never overwrite a key.
	if code, _ := run("ca", "--dir", dir); code != ExitError {
		t.Fatalf("second CA in the same dir: exit %d", code)
	}
	if code, _ := run("node", "--dir", dir, "--id", "bad id"); code != ExitUsage {
		t.Fatalf("invalid node id: exit %d", code)
	}
}

// Creating a cluster must be said out loud.
func TestBootstrapNeedsNewDomain(t *testing.T) {
	dir := t.TempDir()
	sec, peer := secretFile(t, dir, "c.secret"), secretFile(t, dir, "p2.secret")
	if err := os.WriteFile(peer, []byte("fedcba9876543210fedcba9876543210\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := Main([]string{"bootstrap", "--id", "n1", "--data-dir", filepath.Join(dir, "d"),
		"--client-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:7501",
		"--peers", "n1=127.0.0.1:7501,n2=127.0.0.1:7502,n3=127.0.0.1:7503",
		"--secret-file", sec, "--peer-secret-file", peer}, &out, &errb)
	if code != ExitUsage || !strings.Contains(errb.String(), "--new-domain") {
		t.Fatalf("bootstrap without --new-domain: exit %d, stderr %q", code, errb.String())
	}
	for _, f := range []string{"raft.db", "wal"} {
		if _, err := os.Stat(filepath.Join(dir, "d", f)); err == nil {
			t.Fatal("bootstrap without --new-domain touched the data dir")
		}
	}
}

// A node or bootstrap never opens a data dir with the other log store: the
// refusal names the --log-store that opens it. Only bolt and wal exist
// (and auto, the default, which opens either).
func TestNodeRefusesTheOtherLogStore(t *testing.T) {
	dir := t.TempDir()
	sec, peer := secretFile(t, dir, "c.secret"), secretFile(t, dir, "p.secret")
	if err := os.WriteFile(peer, []byte("fedcba9876543210fedcba9876543210\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cmd, wrote string
		flags      []string
	}{
		{"node", "bolt", []string{"--log-store", "wal"}},
		{"bootstrap", "wal", []string{"--new-domain", "--log-store", "bolt"}},
		{"node", "wal", []string{"--log-store", "bolt"}},
	} {
		data := filepath.Join(t.TempDir(), "d")
		if err := os.Mkdir(data, 0o700); err != nil {
			t.Fatal(err)
		}
		s, err := cluster.OpenLogStore(data, cluster.LogStoreKind(tc.wrote))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		code := Main(append([]string{tc.cmd, "--id", "n1", "--data-dir", data,
			"--client-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:7501",
			"--peers", "n1=127.0.0.1:7501,n2=127.0.0.1:7502,n3=127.0.0.1:7503",
			"--secret-file", sec, "--peer-secret-file", peer}, tc.flags...), &out, &errb)
		if want := "start it with --log-store " + tc.wrote; code != ExitError || !strings.Contains(errb.String(), want) {
			t.Errorf("%s %v on a %s data dir: exit %d, stderr %q; want exit 1 saying %q", tc.cmd, tc.flags, tc.wrote, code, errb.String(), want)
		}
		if _, err := os.Stat(filepath.Join(data, "identity")); err == nil {
			t.Errorf("%s %v on a %s data dir created an identity", tc.cmd, tc.flags, tc.wrote)
		}
	}
	var out, errb bytes.Buffer
	code := Main([]string{"node", "--log-store", "lsm"}, &out, &errb)
	if code != ExitUsage || !strings.Contains(errb.String(), "want auto, bolt or wal") {
		t.Errorf("--log-store lsm: exit %d, stderr %q", code, errb.String())
	}
}

// A node's own entry in --peers must name its --peer-addr: the node
// listens on one and tells its peers the other.
func TestCheckPeerAddr(t *testing.T) {
	peers := func(s string) []cluster.Peer {
		p, err := cluster.ParsePeers(s)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	three := peers("n1=127.0.0.1:17500,n2=127.0.0.1:17502,n3=127.0.0.1:17503")
	for _, tc := range []struct {
		id, peerAddr string
		peers        []cluster.Peer
		ok           bool
	}{
		{"n2", "127.0.0.1:17502", three, true},
		{"n2", "127.0.0.1:17504", three, false}, // the replacement
		{"n2", "127.0.0.2:17502", three, false},
		{"n2", "0.0.0.0:17502", three, true}, // listens everywhere, advertises the entry
		{"n2", ":17502", three, true},
		{"n2", "[::]:17502", three, true},
		{"n2", "0.0.0.0:17504", three, false},
		{"n2", "localhost:17502", three, true}, // resolves to the entry's address
		{"n4", "127.0.0.1:17504", three, true}, // not in --peers: a node that joins later
		{"n2", "127.0.0.1:17504", nil, true},   // no --peers: a replacement
	} {
		err := checkPeerAddr(tc.id, tc.peerAddr, tc.peers)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errPeerAddrMismatch)) {
			t.Errorf("%s at %s: %v, want ok %v", tc.id, tc.peerAddr, err, tc.ok)
		}
	}
}

// --log-verify (on by default) and --log-verify-interval reach the node's
// Config.
func TestNodeLogVerifyFlags(t *testing.T) {
	dir := t.TempDir()
	sec, peer := secretFile(t, dir, "c.secret"), secretFile(t, dir, "p.secret")
	if err := os.WriteFile(peer, []byte("fedcba9876543210fedcba9876543210\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--id", "n1", "--data-dir", filepath.Join(dir, "d"), "--client-addr", "127.0.0.1:0",
		"--peer-addr", "127.0.0.1:7501", "--peers", "n1=127.0.0.1:7501,n2=127.0.0.1:7502,n3=127.0.0.1:7503",
		"--secret-file", sec, "--peer-secret-file", peer}
	for _, tc := range []struct {
		flags   []string
		off     bool
		every   time.Duration
		wantErr bool
	}{
		{nil, false, cluster.DefaultLogVerifyInterval, false},
		{[]string{"--log-verify=false"}, true, cluster.DefaultLogVerifyInterval, false},
		{[]string{"--log-verify-interval", "10s"}, false, 10 * time.Second, false},
		{[]string{"--log-verify-interval", "1ms"}, false, 0, true},
	} {
		var out, errb bytes.Buffer
		cfg, _, code := nodeConfig("ticketing node", append(append([]string{}, base...), tc.flags...), &out, &errb, nil)
		if tc.wantErr {
			if cfg != nil || code == 0 || !strings.Contains(errb.String(), "log verify interval") {
				t.Errorf("%v: config %v, exit %d, stderr %q; want refused", tc.flags, cfg != nil, code, errb.String())
			}
			continue
		}
		if cfg == nil {
			t.Fatalf("%v: exit %d: %s", tc.flags, code, errb.String())
		}
		if cfg.DisableLogVerify != tc.off || cfg.LogVerifyInterval != tc.every || cfg.LogVerifyEntries != cluster.DefaultLogVerifyEntries {
			t.Errorf("%v: DisableLogVerify %v, LogVerifyInterval %v, LogVerifyEntries %d", tc.flags, cfg.DisableLogVerify,
				cfg.LogVerifyInterval, cfg.LogVerifyEntries)
		}
	}
}

// --position-interval reaches the node's Config (default 1 s), and one
// outside 10ms..1m is refused.
func TestNodePositionIntervalFlag(t *testing.T) {
	dir := t.TempDir()
	sec, peer := secretFile(t, dir, "c.secret"), secretFile(t, dir, "p.secret")
	if err := os.WriteFile(peer, []byte("fedcba9876543210fedcba9876543210\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--id", "n1", "--data-dir", filepath.Join(dir, "d"), "--client-addr", "127.0.0.1:0",
		"--peer-addr", "127.0.0.1:7501", "--peers", "n1=127.0.0.1:7501,n2=127.0.0.1:7502,n3=127.0.0.1:7503",
		"--secret-file", sec, "--peer-secret-file", peer}
	for _, tc := range []struct {
		flags   []string
		want    time.Duration
		wantErr bool
	}{
		{nil, time.Second, false},
		{[]string{"--position-interval", "250ms"}, 250 * time.Millisecond, false},
		{[]string{"--position-interval", "1ms"}, 0, true},
		{[]string{"--position-interval", "2m"}, 0, true},
	} {
		var out, errb bytes.Buffer
		cfg, _, code := nodeConfig("ticketing node", append(append([]string{}, base...), tc.flags...), &out, &errb, nil)
		if tc.wantErr {
			if cfg != nil || code == 0 || !strings.Contains(errb.String(), "position interval") {
				t.Errorf("%v: config %v, exit %d, stderr %q; want refused", tc.flags, cfg != nil, code, errb.String())
			}
			continue
		}
		if cfg == nil {
			t.Fatalf("%v: exit %d: %s", tc.flags, code, errb.String())
		}
		if cfg.PositionInterval != tc.want {
			t.Errorf("%v: PositionInterval %v, want %v", tc.flags, cfg.PositionInterval, tc.want)
		}
	}
}
