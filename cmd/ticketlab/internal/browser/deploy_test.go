package browser

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	ticketing "ticketing/clients/go"
	"ticketing/cmd/ticketlab/internal/labtest"
)

// deployment is the README's deployment (docs/operations.md, "Running a
// cluster") on this machine: three `ticketing node` processes with TLS
// (a private CA from `ticketing certs`), the three secrets, bootstrapped
// with a new domain, each serving its console beyond loopback (HTTPS with
// the node's certificate, the admin secret's login), and a sidecar.
type deployment struct {
	dir, socket string
	adminSecret string
	// consoles are the nodes' console URLs (https://127.0.0.1:PORT/), by
	// node id.
	consoles map[string]string
	// spki are the base64 SHA-256 hashes of the nodes' certificates'
	// public keys: the browser trusts these (and no other certificate)
	// without knowing the test CA.
	spki []string
}

// freePorts returns n TCP ports free on this machine now.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// stop ends a process with SIGTERM, then SIGKILL after 15 s.
func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// startDeployment sets the deployment up and waits until its three nodes
// are members, one leads and serves, and the sidecar is ready.
func startDeployment(t *testing.T, bin string) deployment {
	t.Helper()
	dir, err := os.MkdirTemp("", "tkd") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := deployment{dir: dir, socket: filepath.Join(dir, "t.sock"), consoles: map[string]string{}}
	for _, name := range []string{"client.secret", "peer.secret", "admin.secret"} {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		if name == "admin.secret" {
			d.adminSecret = hex.EncodeToString(b)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tk := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("ticketing %q: %v\n%s", args, err, out)
		}
		return string(out)
	}
	tk("certs", "ca", "--dir", "pki")
	ports := freePorts(t, 12)
	addr := func(n, k int) string { return fmt.Sprintf("127.0.0.1:%d", ports[4*(n-1)+k]) }
	var peers, clients, admins []string
	for n := 1; n <= 3; n++ {
		id := fmt.Sprintf("n%d", n)
		tk("certs", "node", "--dir", "pki", "--id", id, "--host", "127.0.0.1")
		peers = append(peers, id+"="+addr(n, 1))
		clients = append(clients, addr(n, 0))
		admins = append(admins, addr(n, 2))
		d.consoles[id] = fmt.Sprintf("https://127.0.0.1:%d/", ports[4*(n-1)+3])
		pemBytes, err := os.ReadFile(filepath.Join(dir, "pki", id+".crt"))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(pemBytes)
		if blk == nil {
			t.Fatalf("pki/%s.crt holds no PEM block", id)
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
		d.spki = append(d.spki, base64.StdEncoding.EncodeToString(sum[:]))
	}
	flags := func(n int) []string {
		id := fmt.Sprintf("n%d", n)
		return []string{"--id", id, "--cluster-id", "prod", "--data-dir", filepath.Join(dir, "data", id),
			"--client-addr", addr(n, 0), "--peer-addr", addr(n, 1), "--admin-addr", addr(n, 2),
			"--peers", strings.Join(peers, ","), "--secret-file", "client.secret", "--peer-secret-file", "peer.secret",
			"--admin-secret-file", "admin.secret", "--tls-cert", "pki/" + id + ".crt", "--tls-key", "pki/" + id + ".key",
			"--tls-ca", "pki/ca.crt"}
	}
	logs := func() string {
		var b strings.Builder
		for _, name := range []string{"n1", "n2", "n3", "sidecar"} {
			out, _ := os.ReadFile(filepath.Join(dir, name+".log"))
			fmt.Fprintf(&b, "--- %s.log\n%s", name, out)
		}
		return b.String()
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { logf.Close() })
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stop(cmd) })
	}
	// The console on every address of the machine (beyond loopback: the
	// node serves it only with TLS and the admin secret).
	console := func(n int) []string { return []string{"--console-addr", fmt.Sprintf("0.0.0.0:%d", ports[4*(n-1)+3])} }
	run("n2", append(append([]string{"node"}, flags(2)...), console(2)...)...)
	run("n3", append(append([]string{"node"}, flags(3)...), console(3)...)...)
	tk(append([]string{"bootstrap", "--new-domain"}, flags(1)...)...)
	run("n1", append(append([]string{"node"}, flags(1)...), console(1)...)...)
	for until := time.Now().Add(45 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		cmd := exec.Command(bin, "status", "--admin", strings.Join(admins, ","), "--admin-secret-file", "admin.secret",
			"--tls-ca", "pki/ca.crt", "--cluster-id", "prod", "--timeout", "5s")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err == nil && strings.Contains(string(out), "(leader, serving)") && strings.Count(string(out), " yes ") == 3 {
			break
		}
		if time.Now().After(until) {
			t.Fatalf("the deployment never served: %v\n%s\n%s", err, out, logs())
		}
	}
	run("sidecar", "sidecar", "--cluster", strings.Join(clients, ","), "--cluster-id", "prod",
		"--secret-file", "client.secret", "--tls-ca", "pki/ca.crt", "--socket", d.socket)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ticketing.WaitReady(ctx, d.socket); err != nil {
		t.Fatalf("the sidecar: %v\n%s", err, logs())
	}
	return d
}

// The console against the README's deployment: three TLS nodes, each with
// its console on HTTPS beyond loopback, and a sidecar. A lock is taken
// through the sidecar with a waiter behind it; the browser (trusting the
// nodes' certificates only) logs in with the admin secret on a follower's
// console, which shows the lock but answers a revoke with "not the leader",
// naming it; on the leader's console the revoke hands the key to the
// waiter, with a larger token. No console error on the page all along.
func TestConsoleRevokeOnTheREADMEDeployment(t *testing.T) {
	bin, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	start := time.Now()
	d := startDeployment(t, bin)
	t.Logf("the deployment served after %v", time.Since(start).Round(time.Millisecond))

	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	holder, err := ticketing.Dial(cctx, d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	waiter, err := ticketing.Dial(cctx, d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	lk, err := holder.Lock(cctx, "orders/7", 120*time.Second, 0, ticketing.WithLabel("batch-7"))
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan struct{})
	next := make(chan grant, 1)
	go func() {
		l, err := waiter.Lock(cctx, "orders/7", 30*time.Second, 60*time.Second, ticketing.WithLabel("batch-8"),
			ticketing.WithQueued(func() { close(queued) }))
		if err != nil {
			next <- grant{err: err}
			return
		}
		next <- grant{token: l.Token()}
	}()
	select {
	case <-queued:
	case <-cctx.Done():
		t.Fatal("the waiter was never queued")
	}

	ctx, pageErrors := browserCtx(t, chromedp.Flag("ignore-certificate-errors-spki-list", strings.Join(d.spki, ",")))
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	// n1's console first, to learn the leader.
	var loc, leader string
	if err := chromedp.Run(ctx,
		chromedp.Navigate(d.consoles["n1"]),
		chromedp.WaitVisible(`input[name="secret"]`, chromedp.ByQuery),
		chromedp.Location(&loc),
		chromedp.SendKeys(`input[name="secret"]`, d.adminSecret, chromedp.ByQuery),
		chromedp.Submit(`input[name="secret"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#conn.live`, chromedp.ByQuery),
		chromedp.WaitVisible(`#members tbody tr:nth-child(3)`, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("logging in on n1's console (%s): %v", loc, err)
	}
	if !strings.HasPrefix(loc, "https://") || !strings.HasSuffix(loc, "/login") {
		t.Fatalf("an unauthenticated browser landed on %s, want the HTTPS login", loc)
	}
	if err := chromedp.Run(ctx, chromedp.Text(`#leader`, &leader, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	// The leader's server id is its node id and the incarnation of its
	// data directory: n2/k3q...
	leaderName, _, _ := strings.Cut(leader, "/")
	if d.consoles[leaderName] == "" {
		t.Fatalf("n1's console names the leader %q, not one of n1..n3", leader)
	}
	follower := "n1"
	if leaderName == "n1" {
		follower = "n2"
	}

	// A follower's console: it shows the lock; its revoke is refused,
	// naming the leader, and changes nothing.
	row := `#lines tbody tr[data-key="orders/7"]`
	holderSel := fmt.Sprintf(`#keyview .holder[data-token="%d"]`, lk.Token())
	var outcome string
	if err := chromedp.Run(ctx,
		chromedp.Navigate(d.consoles[follower]),
		chromedp.Location(&loc),
	); err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(loc, "/login") { // each node's console has its own session
		if err := chromedp.Run(ctx,
			chromedp.WaitVisible(`input[name="secret"]`, chromedp.ByQuery),
			chromedp.SendKeys(`input[name="secret"]`, d.adminSecret, chromedp.ByQuery),
			chromedp.Submit(`input[name="secret"]`, chromedp.ByQuery),
		); err != nil {
			t.Fatal(err)
		}
	}
	if err := chromedp.Run(ctx,
		chromedp.WaitVisible(`#conn.live`, chromedp.ByQuery),
		chromedp.WaitVisible(row, chromedp.ByQuery),
		chromedp.Click(row, chromedp.ByQuery),
		chromedp.WaitVisible(holderSel+` button.revoke`, chromedp.ByQuery),
		chromedp.Click(holderSel+` button.revoke`, chromedp.ByQuery),
		chromedp.WaitVisible(`#revokedialog`, chromedp.ByQuery),
		chromedp.SendKeys(`#rv-reason`, "tried on a follower", chromedp.ByQuery),
		chromedp.Click(`#rv-confirm`, chromedp.ByQuery),
		chromedp.WaitVisible(`#revokeresult[data-outcome="not_leader"]`, chromedp.ByQuery),
		chromedp.Text(`#revokeresult`, &outcome, chromedp.ByQuery),
	); err != nil {
		var shown string
		_ = chromedp.Run(ctx, chromedp.Text(`#revokeresult`, &shown, chromedp.ByQuery))
		t.Fatalf("a revoke on the follower %s: %v (the page says %q)", follower, err, shown)
	}
	if !strings.Contains(outcome, "the leader is "+leader) {
		t.Fatalf("the follower's answer %q does not name the leader %s", outcome, leader)
	}
	t.Logf("on the follower %s: %q", follower, outcome)

	// The leader's console revokes.
	if err := chromedp.Run(ctx,
		chromedp.Navigate(d.consoles[leaderName]),
		chromedp.Location(&loc),
	); err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(loc, "/login") {
		if err := chromedp.Run(ctx,
			chromedp.WaitVisible(`input[name="secret"]`, chromedp.ByQuery),
			chromedp.SendKeys(`input[name="secret"]`, d.adminSecret, chromedp.ByQuery),
			chromedp.Submit(`input[name="secret"]`, chromedp.ByQuery),
		); err != nil {
			t.Fatal(err)
		}
	}
	if err := chromedp.Run(ctx,
		chromedp.WaitVisible(`#conn.live`, chromedp.ByQuery),
		chromedp.WaitVisible(row, chromedp.ByQuery),
		chromedp.Click(row, chromedp.ByQuery),
		chromedp.WaitVisible(holderSel, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("the leader %s's console: %v", leader, err)
	}
	revokeFromThePage(t, ctx, lk.Token(), "batch-7", "batch-7 is stuck, ticket OPS-18", next)
	if errs := pageErrors(); len(errs) > 0 {
		t.Fatalf("the page logged errors:\n%s", strings.Join(errs, "\n"))
	}
	t.Logf("done after %v", time.Since(start).Round(time.Millisecond))
}
