package main

// The documentation's checked examples and its links.
//
// A fenced shell block preceded by a line
//
//	<!-- check: ENV -->        (or <!-- check: ENV output -->)
//
// in README.md, docs/*.md, packaging/README.md, unixapi/PROTOCOL.md or
// clients/README.md is run by
// TestDocExamples with bash (set -e -o pipefail), the binary under test
// first on PATH as `ticketing`. ENV is where it runs:
//
//	dev      in a directory where a real `ticketing dev` (free ports) serves
//	         ./ticketing.sock; one dev for every such block, whose
//	         `export TICKETING_ADMIN=...` line, as dev printed it, runs
//	         first (the Quick start has the reader paste it)
//	nodes    in a directory holding client.secret, peer.secret,
//	         admin.secret, pki/ (ca.crt, n1..n3) and n1's node.conf, beside
//	         three real `ticketing node` processes with TLS, an admin port
//	         and cluster-id prod (n1 runs from its node.conf): the docs'
//	         example cluster, bootstrapped once
//	scratch  in a new empty directory, nothing running
//	repo     in the repository's root, nothing running, with TICKETING_BIN
//	         set to the binary under test too: for `go run ./clients/...`
//	         examples that start their own cluster from it (the
//	         waiting-room example in docs/verification.md)
//
// A marker may end in "hold KEY for Ns" (dev only): before the block
// starts, the test takes KEY on a connection of its own and releases it N
// seconds after the block started, so that a waited ACQUIRE in the block
// is really waited for (its grant comes N seconds late; a client that
// stops reading sooner prints nothing).
//
// A marker "<!-- check: nodes sidecar -->" stands before a block that
// starts a sidecar serving ./ticketing.sock (after the placeholders) and
// runs until stopped: the test runs it in the background, passes it once
// the sidecar's INFO names a leader (it reached the cluster: the
// documented flags fit the example cluster's TLS, secret and cluster id),
// fails with its log if it exits or never does, then stops it.
//
// A block whose lines start with "$ " is a console session: the "$ " lines
// are the commands, the others their output, which is compared line by
// line when the marker says `output` ("…" in an expected line matches any
// text). Any other block is a script, run as a whole.
//
// Placeholders: the documents use the example cluster's addresses and the
// Debian paths. Before a block runs, 10.0.0.N becomes 127.X.0.N (X picked
// per run: loopback, with the documented ports 7400/7500/7600 kept), and
// /etc/ticketing/ becomes the directory the block runs in, /var/lib/ticketing
// its data/, /run/ticketing/ticketing.sock ./ticketing.sock and
// /path/to/ticketing (the reader's checkout) this repository's root. A
// block that still names a 10.x address after that is refused, not run.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"

	"ticketing/unixapi"
)

// docFiles are the documents whose examples and links are checked,
// relative to the repository root.
func docFiles(t *testing.T) []string {
	files := []string{"README.md", "packaging/README.md", "unixapi/PROTOCOL.md", "clients/README.md"}
	docs, err := filepath.Glob(filepath.Join(repoRoot(t), "docs", "*.md"))
	if err != nil || len(docs) < 4 {
		t.Fatalf("docs/*.md: %v %v", docs, err)
	}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	return files
}

func repoRoot(t *testing.T) string {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// docExample is one checked block.
type docExample struct {
	file   string
	line   int // of the marker
	env    string
	output bool
	// sidecar: the block runs a sidecar, checked by its INFO (see above).
	sidecar bool
	// hold is the key the test holds while the block starts, released
	// holdFor after the block started ("" none).
	hold    string
	holdFor time.Duration
	text    string // the block's lines
}

func (e docExample) String() string { return fmt.Sprintf("%s:%d", e.file, e.line) }

var checkMarker = regexp.MustCompile(`^<!-- check: (\w+)( output| sidecar)?(?: hold (\S+) for ([1-9][0-9]?)s)? -->$`)

// docExamples finds the checked blocks of the documents.
func docExamples(t *testing.T) []docExample {
	var out []docExample
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), f))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		fence := false
		for i := 0; i < len(lines); i++ {
			if strings.HasPrefix(lines[i], "```") {
				fence = !fence
			}
			m := checkMarker.FindStringSubmatch(strings.TrimSpace(lines[i]))
			if m == nil || fence {
				if !fence && strings.HasPrefix(strings.TrimSpace(lines[i]), "<!-- check") {
					t.Errorf("%s:%d: malformed check marker %q", f, i+1, lines[i])
				}
				continue
			}
			ex := docExample{file: f, line: i + 1, env: m[1], output: m[2] == " output", sidecar: m[2] == " sidecar", hold: m[3]}
			if ex.env != "dev" && ex.env != "nodes" && ex.env != "scratch" && ex.env != "repo" {
				t.Errorf("%s: unknown environment %q", ex, ex.env)
			}
			if ex.sidecar && (ex.env != "nodes" || ex.hold != "") {
				t.Errorf("%s: sidecar is for the nodes environment, without hold", ex)
			}
			if ex.hold != "" {
				n, _ := strconv.Atoi(m[4])
				ex.holdFor = time.Duration(n) * time.Second
				if ex.env != "dev" {
					t.Errorf("%s: hold needs the dev environment (its ./ticketing.sock)", ex)
				}
			}
			if i+1 >= len(lines) || (lines[i+1] != "```sh" && lines[i+1] != "```console") {
				t.Errorf("%s: a check marker must stand right before a ```sh or ```console block", ex)
				continue
			}
			var body []string
			j := i + 2
			for ; j < len(lines) && lines[j] != "```"; j++ {
				body = append(body, lines[j])
			}
			if j == len(lines) {
				t.Errorf("%s: unterminated block", ex)
			}
			ex.text = strings.Join(body, "\n")
			out = append(out, ex)
			i = j
		}
	}
	return out
}

// script turns a block into what bash runs and the output it must print
// (nil: not compared).
func (e docExample) script() (string, []string) {
	lines := strings.Split(e.text, "\n")
	console := false
	for _, l := range lines {
		if strings.HasPrefix(l, "$ ") {
			console = true
		}
	}
	if !console {
		return e.text, nil
	}
	var cmds, want []string
	for _, l := range lines {
		if c, ok := strings.CutPrefix(l, "$ "); ok {
			cmds = append(cmds, c)
		} else {
			want = append(want, l)
		}
	}
	if !e.output {
		want = nil
	}
	return strings.Join(cmds, "\n"), want
}

// placeholders is the substitution of the documents' placeholders for one
// run (see the comment at the top).
type placeholders struct {
	octet int
	repo  string // the repository's root, for /path/to/ticketing
}

func (p placeholders) apply(s, dir string) string {
	s = regexp.MustCompile(`\b10\.0\.0\.(\d+)\b`).ReplaceAllString(s, fmt.Sprintf("127.%d.0.$1", p.octet))
	s = strings.ReplaceAll(s, "/run/ticketing/ticketing.sock", "./ticketing.sock")
	s = strings.ReplaceAll(s, "/etc/ticketing/", dir+"/")
	s = strings.ReplaceAll(s, "/var/lib/ticketing", dir+"/data")
	s = strings.ReplaceAll(s, "/path/to/ticketing", p.repo)
	return s
}

// addr is node n's (1-based) address on port in this run.
func (p placeholders) addr(n, port int) string {
	return fmt.Sprintf("127.%d.0.%d:%d", p.octet, n, port)
}

var privateAddr = regexp.MustCompile(`\b10\.\d+\.\d+\.\d+\b`)

// pickPlaceholders picks the loopback block 127.X.0.0/24 whose documented
// ports are free.
func pickPlaceholders(t *testing.T) placeholders {
	for try := 0; try < 20; try++ {
		n, err := rand.Int(rand.Reader, big.NewInt(200))
		if err != nil {
			t.Fatal(err)
		}
		p := placeholders{octet: 20 + int(n.Int64())}
		free := true
		for node := 1; node <= 4 && free; node++ {
			for _, port := range []int{7400, 7500, 7600} {
				ln, err := net.Listen("tcp", p.addr(node, port))
				if err != nil {
					free = false
					break
				}
				ln.Close()
			}
		}
		if free {
			return p
		}
	}
	t.Fatal("no free 127.X.0.0/24 block for the documented ports")
	return placeholders{}
}

// TestDocExamples runs every checked example of the documentation.
func TestDocExamples(t *testing.T) {
	examples := docExamples(t)
	if t.Failed() {
		t.FailNow()
	}
	envs := map[string]int{}
	for _, e := range examples {
		envs[e.env]++
	}
	if envs["dev"] == 0 || envs["nodes"] == 0 {
		t.Fatalf("want checked examples for dev and for nodes, found %v", envs)
	}
	for _, tool := range []string{"bash", "socat", "xxd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the examples need %s (make test installs it: .ci/packages): %v", tool, err)
		}
	}
	ph := pickPlaceholders(t)
	ph.repo = repoRoot(t)
	dirs := map[string]string{}
	devExport := ""
	if envs["dev"] > 0 {
		dirs["dev"], devExport = startDocDev(t)
	}
	if envs["nodes"] > 0 {
		dirs["nodes"] = startDocNodes(t, ph)
	}
	path := filepath.Dir(binary) + string(os.PathListSeparator) + os.Getenv("PATH")
	for _, e := range examples {
		t.Run(e.String(), func(t *testing.T) {
			dir := dirs[e.env]
			switch e.env {
			case "scratch":
				dir = t.TempDir()
			case "repo":
				dir = ph.repo
			}
			sh, want := e.script()
			sh = ph.apply(sh, dir)
			if e.env == "dev" {
				sh = devExport + "\n" + sh
			}
			if a := privateAddr.FindString(sh); a != "" {
				t.Fatalf("%s: %s is left after the placeholders; only loopback is ever dialled", e, a)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", sh)
			cmd.Dir = dir
			cmd.Env = append(withoutEnv(os.Environ(), "TICKETING_SOCKET", "PATH", "TICKETING_ADMIN", "TICKETING_ADMIN_SECRET_FILE",
				"TICKETING_TLS_CA", "TICKETING_CLUSTER_ID", "TICKETING_BIN"), "PATH="+path)
			if e.env == "repo" {
				// The example starts its own nodes and sidecar from the
				// binary under test rather than building one.
				cmd.Env = append(cmd.Env, "TICKETING_BIN="+binary)
			}
			if e.sidecar {
				checkDocSidecar(t, e, cmd, sh)
				return
			}
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			var h *docHolder
			if e.hold != "" {
				h = holdKey(t, filepath.Join(dir, "ticketing.sock"), e.hold)
			}
			err := cmd.Start()
			if h != nil {
				h.releaseAfter(e.holdFor)
			}
			if err == nil {
				err = cmd.Wait()
			}
			if h != nil {
				if herr := h.wait(); herr != nil {
					t.Errorf("%s: the test's hold of %s: %v", e, e.hold, herr)
				}
			}
			if err != nil {
				t.Fatalf("%s (%s) failed: %v\n--- script\n%s\n--- output\n%s", e, e.env, err, sh, out.String())
			}
			if want != nil {
				checkOutput(t, e, want, out.String())
			}
		})
	}
}

// checkDocSidecar runs cmd, a block that starts a sidecar serving
// ./ticketing.sock in cmd.Dir, and passes once the sidecar's INFO names a
// leader: it reached the example cluster with the flags the document
// gives. A sidecar that cannot (a missing --cluster-id, secret or CA)
// serves its socket all the same, with leader=- in INFO.
func checkDocSidecar(t *testing.T, e docExample, cmd *exec.Cmd, sh string) {
	t.Helper()
	var out syncBuffer // written by the running sidecar, read on a failure
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its own process group, so that stopping it stops the sidecar bash
	// started, not only bash.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error // set before exited is closed
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	sock := filepath.Join(cmd.Dir, "ticketing.sock")
	info := ""
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		// Gone with its sidecar, so that later blocks find no stale socket.
		os.Remove(sock)
	}()
	for until := time.Now().Add(30 * time.Second); time.Now().Before(until); time.Sleep(200 * time.Millisecond) {
		select {
		case <-exited:
			t.Fatalf("%s: the sidecar exited: %v\n--- script\n%s\n--- output\n%s", e, waitErr, sh, out.String())
		default:
		}
		info = sidecarInfo(sock)
		if strings.HasPrefix(info, "INFO ") && !strings.Contains(info, " leader=- ") && strings.Contains(info, " leader=") {
			return
		}
	}
	t.Fatalf("%s: the sidecar never reached the cluster's leader within 30 s (last INFO %q)\n--- script\n%s\n--- output\n%s",
		e, info, sh, out.String())
}

// sidecarInfo asks the sidecar at sock for its INFO line ("" when it does
// not answer).
func sidecarInfo(sock string) string {
	conn, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return ""
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "INFO\n"); err != nil {
		return ""
	}
	line, _ := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line)
}

// docHolder holds a key on a connection of its own to a sidecar (a
// marker's "hold KEY for Ns").
type docHolder struct {
	conn  net.Conn
	rd    *bufio.Reader
	key   string
	token string
	done  chan error
}

// holdKey takes key through the sidecar at sock: granted at once, since
// nothing else holds it between the examples.
func holdKey(t *testing.T, sock, key string) *docHolder {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(60 * time.Second)) // a hang guard only
	h := &docHolder{conn: conn, rd: bufio.NewReader(conn), key: key, done: make(chan error, 1)}
	if _, err := fmt.Fprintf(conn, "ACQUIRE %s 60 10\n", key); err != nil {
		t.Fatal(err)
	}
	reply, err := h.rd.ReadString('\n')
	tok, ok := strings.CutPrefix(strings.TrimSpace(reply), "OK ")
	if err != nil || !ok {
		t.Fatalf("holding %s for the example: %q, %v", key, reply, err)
	}
	h.token = tok
	return h
}

// releaseAfter releases the key d from now, in the background.
func (h *docHolder) releaseAfter(d time.Duration) {
	time.AfterFunc(d, func() {
		if _, err := fmt.Fprintf(h.conn, "RELEASE %s %s\n", h.key, h.token); err != nil {
			h.done <- err
			return
		}
		reply, err := h.rd.ReadString('\n')
		if err == nil && strings.TrimSpace(reply) != "OK" {
			err = fmt.Errorf("RELEASE answered %q", reply)
		}
		h.done <- err
	})
}

// wait waits for the release and closes the connection.
func (h *docHolder) wait() error {
	err := <-h.done
	h.conn.Close()
	return err
}

// checkOutput compares a console example's documented output with the
// real one, line by line; "…" matches any text.
func checkOutput(t *testing.T, e docExample, want []string, got string) {
	t.Helper()
	gotLines := strings.Split(strings.TrimRight(got, "\n"), "\n")
	ok := len(gotLines) == len(want)
	for i := 0; ok && i < len(want); i++ {
		parts := strings.Split(want[i], "…")
		for j := range parts {
			parts[j] = regexp.QuoteMeta(parts[j])
		}
		ok = regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(gotLines[i])
	}
	if !ok {
		t.Errorf("%s: the documented output drifted\n--- documented\n%s\n--- real\n%s", e, strings.Join(want, "\n"), got)
	}
}

func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		keep := true
		for _, n := range names {
			if strings.HasPrefix(kv, n+"=") {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}

// startDocDev runs `ticketing dev` serving ./ticketing.sock in a new
// directory and returns the directory and the export line dev printed,
// once dev is ready.
func startDocDev(t *testing.T) (string, string) {
	dir := shortDir(t)
	cmd := exec.Command(binary, "dev", "--base-port", "0", "--dir", filepath.Join(dir, "data"))
	cmd.Dir = dir
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr // quiet when all is well (dev logs no warnings then)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopProcess(cmd) })
	deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer deadline.Stop()
	sc := bufio.NewScanner(stdout)
	export := ""
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "export TICKETING_ADMIN=") {
			export = l
		}
		if strings.Contains(sc.Text(), ": ready in ") {
			go func() {
				for sc.Scan() {
				}
			}()
			if export == "" {
				t.Fatal("ticketing dev printed no export line for the operator commands")
			}
			return dir, export
		}
	}
	t.Fatal("ticketing dev never printed its ready line")
	return "", ""
}

// startDocNodes sets up the docs' example cluster: the files, three node
// processes on 127.X.0.1-3 with the documented ports, bootstrapped.
func startDocNodes(t *testing.T, ph placeholders) string {
	dir := t.TempDir()
	for _, name := range []string{"client.secret", "peer.secret", "admin.secret"} {
		b := make([]byte, 32)
		rand.Read(b)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tk := func(args ...string) {
		t.Helper()
		cmd := exec.Command(binary, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("ticketing %q: %v\n%s", args, err, out)
		}
	}
	tk("certs", "ca", "--dir", "pki")
	var peers []string
	for n := 1; n <= 3; n++ {
		tk("certs", "node", "--dir", "pki", "--id", fmt.Sprintf("n%d", n), "--host", strings.Split(ph.addr(n, 0), ":")[0])
		peers = append(peers, fmt.Sprintf("n%d=%s", n, ph.addr(n, 7500)))
	}
	flags := func(n int) []string {
		id := fmt.Sprintf("n%d", n)
		return []string{"--id", id, "--cluster-id", "prod", "--data-dir", filepath.Join(dir, "data", id),
			"--client-addr", ph.addr(n, 7400), "--peer-addr", ph.addr(n, 7500), "--admin-addr", ph.addr(n, 7600),
			"--peers", strings.Join(peers, ","), "--secret-file", "client.secret", "--peer-secret-file", "peer.secret",
			"--admin-secret-file", "admin.secret", "--tls-cert", "pki/" + id + ".crt", "--tls-key", "pki/" + id + ".key",
			"--tls-ca", "pki/ca.crt"}
	}
	// n1's settings as its configuration file (packaging/etc/node.conf's
	// format), from which n1 runs and which the operator commands'
	// --config reads.
	var conf strings.Builder
	f1 := flags(1)
	for i := 0; i+1 < len(f1); i += 2 {
		fmt.Fprintf(&conf, "%s = %s\n", strings.TrimPrefix(f1[i], "--"), f1[i+1])
	}
	if err := os.WriteFile(filepath.Join(dir, "node.conf"), []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(n int) {
		args := append([]string{"node"}, flags(n)...)
		if n == 1 {
			args = []string{"node", "--config", "node.conf"}
		}
		cmd := exec.Command(binary, args...)
		cmd.Dir = dir
		// Each node's log in the directory: shown when the cluster does
		// not come up, and by a failing example's own output otherwise.
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("n%d.log", n)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { logf.Close() })
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stopProcess(cmd) })
	}
	start(2)
	start(3)
	tk(append([]string{"bootstrap", "--new-domain"}, flags(1)...)...)
	start(1)
	admin := ph.addr(1, 7600) + "," + ph.addr(2, 7600) + "," + ph.addr(3, 7600)
	for until := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		cmd := exec.Command(binary, "status", "--admin", admin, "--admin-secret-file", "admin.secret",
			"--tls-ca", "pki/ca.crt", "--cluster-id", "prod", "--timeout", "5s")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err == nil && strings.Contains(string(out), "(leader, serving)") && strings.Count(string(out), " yes ") == 3 {
			return dir
		}
		if time.Now().After(until) {
			var logs strings.Builder
			for n := 1; n <= 3; n++ {
				b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("n%d.log", n)))
				fmt.Fprintf(&logs, "--- n%d.log\n%s", n, b)
			}
			t.Fatalf("the example cluster never served: %v\n%s\n%s", err, out, logs.String())
		}
	}
}

// stopProcess stops a process with SIGTERM, then SIGKILL after 15 s.
func stopProcess(cmd *exec.Cmd) {
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

// TestDocProtocolVersion holds the documents to the local API's version
// that INFO prints (unixapi.ProtocolVersion, INFO's protocol= field):
// every "protocol=N" they show, PROTOCOL.md's title, the last row of its
// version table and its INFO description. (They once said 2 while INFO
// printed 3.)
func TestDocProtocolVersion(t *testing.T) {
	root := repoRoot(t)
	want := strconv.Itoa(unixapi.ProtocolVersion)
	files := docFiles(t)
	more, _ := filepath.Glob(filepath.Join(root, "clients", "*", "README.md"))
	for _, f := range more {
		rel, _ := filepath.Rel(root, f)
		files = append(files, rel)
	}
	infoField := regexp.MustCompile(`\bprotocol=(\d+)`)
	seen := 0
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for n, l := range strings.Split(string(b), "\n") {
			for _, m := range infoField.FindAllStringSubmatch(l, -1) {
				seen++
				if m[1] != want {
					t.Errorf("%s:%d: shows INFO's protocol=%s; INFO prints protocol=%s", f, n+1, m[1], want)
				}
			}
		}
	}
	if seen == 0 {
		t.Errorf("no document shows an INFO line with protocol=%s (docs/operations.md has one)", want)
	}
	b, err := os.ReadFile(filepath.Join(root, "unixapi", "PROTOCOL.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, c := range []struct{ what, re string }{
		{"the title", `\A# .*, version (\d+)\n`},
		{"the version table's last row", `(?m)^\| (\d+) \|[^\n]*\n\n`},
		{"INFO's protocol field", "the version of this document the sidecar speaks\\s+\\(`(\\d+)`"},
	} {
		m := regexp.MustCompile(c.re).FindStringSubmatch(doc)
		switch {
		case m == nil:
			t.Errorf("unixapi/PROTOCOL.md: %s not found (%s)", c.what, c.re)
		case m[1] != want:
			t.Errorf("unixapi/PROTOCOL.md: %s says version %s; INFO prints protocol=%s", c.what, m[1], want)
		}
	}
}

// TestDocClientsHello holds what the documents and the clients' own doc
// comments say the libraries send first ("connects with `HELLO N events`",
// "starts with", "the first request is") to the version they send: each
// client's protocol constant, which must be the sidecar's. (clients/README.md
// and the Python docs once said `HELLO 4 events` while the clients sent 5.)
func TestDocClientsHello(t *testing.T) {
	root := repoRoot(t)
	want := strconv.Itoa(unixapi.ProtocolVersion)
	consts := []struct{ file, re string }{
		{"clients/python/ticketing/_protocol.py", `(?m)^PROTOCOL_VERSION = (\d+)$`},
		{"clients/node/lib/protocol.js", `(?m)^const PROTOCOL_VERSION = (\d+);$`},
		{"clients/go/client.go", `(?m)^const ProtocolVersion = (\d+)$`},
	}
	for _, c := range consts {
		b, err := os.ReadFile(filepath.Join(root, c.file))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(c.re).FindSubmatch(b)
		if m == nil {
			t.Errorf("%s: no protocol version constant (%s)", c.file, c.re)
		} else if string(m[1]) != want {
			t.Errorf("%s: the client speaks version %s; the sidecar speaks %s", c.file, m[1], want)
		}
	}
	files := []string{"clients/README.md"}
	for _, pat := range []string{"clients/*/README.md", "clients/go/*.go", "clients/python/ticketing/*.py", "clients/node/lib/*.js"} {
		more, _ := filepath.Glob(filepath.Join(root, pat))
		for _, f := range more {
			if rel, _ := filepath.Rel(root, f); !strings.HasSuffix(rel, "_test.go") {
				files = append(files, rel)
			}
		}
	}
	// A claim about what the library sends: "connects with", "starts
	// with", "first request is", "sends", then the HELLO line (quoted).
	claim := regexp.MustCompile("(?i)(connects with|starts? with|first request is|first request, |sends?|pipelined before[^`]*)\\s*[`']{1,2}HELLO (\\d+) events")
	seen := 0
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(string(b)), " ") // claims wrap across lines
		text = strings.NewReplacer("// ", "", "# ", "", "* ", "").Replace(text)
		for _, m := range claim.FindAllStringSubmatch(text, -1) {
			seen++
			if m[2] != want {
				t.Errorf("%s: %q: the clients send HELLO %s events", f, m[0], want)
			}
		}
	}
	t.Logf("%d claims checked", seen)
	if seen < 4 {
		t.Errorf("found %d claims of the HELLO the clients send; clients/README.md, the Python and Node READMEs and the clients' doc comments make them", seen)
	}
}

// TestDocMetrics: every ticketing_* metric a real node and a real sidecar
// serve on /metrics has its row in docs/operations.md's metric tables
// (ticketing_node_block_grants_total once had none).
func TestDocMetrics(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	dir := shortDir(t)
	for _, name := range []string{"client.secret", "peer.secret"} {
		sec := make([]byte, 32)
		rand.Read(sec)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(hex.EncodeToString(sec)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	client, peer, nodeMetrics, sidecarMetrics := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	// A node that is not bootstrapped registers every metric all the
	// same; the sidecar's are there before it reaches a node.
	procs := [][]string{
		{"node", "--id", "n1", "--data-dir", filepath.Join(dir, "data"), "--client-addr", client, "--peer-addr", peer,
			"--peers", "n1=" + peer + ",n2=127.0.0.1:1,n3=127.0.0.1:2", "--secret-file", "client.secret",
			"--peer-secret-file", "peer.secret", "--metrics-addr", nodeMetrics},
		{"sidecar", "--cluster", client, "--secret-file", "client.secret", "--insecure-plaintext",
			"--socket", filepath.Join(dir, "ticketing.sock"), "--metrics-addr", sidecarMetrics},
	}
	for _, args := range procs {
		cmd := exec.Command(binary, args...)
		cmd.Dir = dir
		var logs strings.Builder
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			stopProcess(cmd)
			if t.Failed() {
				t.Logf("ticketing %s log:\n%s", args[0], logs.String())
			}
		})
	}
	for _, m := range []struct{ addr, prefix string }{{nodeMetrics, "ticketing_node_"}, {sidecarMetrics, "ticketing_sidecar_"}} {
		var body string
		for until := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			resp, err := http.Get("http://" + m.addr + "/metrics")
			if err == nil {
				b, rerr := io.ReadAll(resp.Body)
				_ = resp.Body.Close() // the body was read whole, or the read's error counts
				if rerr == nil && resp.StatusCode == http.StatusOK {
					body = string(b)
					break
				}
			}
			if time.Now().After(until) {
				t.Fatalf("GET http://%s/metrics: %v", m.addr, err)
			}
		}
		families := 0
		for _, l := range strings.Split(body, "\n") {
			f := strings.Fields(l)
			if len(f) < 3 || f[0] != "#" || f[1] != "TYPE" || !strings.HasPrefix(f[2], "ticketing_") {
				continue
			}
			if !strings.HasPrefix(f[2], m.prefix) {
				t.Errorf("%s serves %s, want the prefix %s", m.addr, f[2], m.prefix)
			}
			families++
			if !strings.Contains(doc, "| `"+f[2]+"` |") {
				t.Errorf("docs/operations.md has no row for the metric %s (%s)", f[2], m.prefix+"*")
			}
		}
		if families < 10 {
			t.Errorf("%s serves only %d ticketing_* metrics:\n%s", m.addr, families, body)
		}
	}
}

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestDocLinks checks the relative links of the documents: the file (or
// directory) exists, and an anchor names a heading of its target.
func TestDocLinks(t *testing.T) {
	root := repoRoot(t)
	anchors := map[string]map[string]bool{} // file -> anchors
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		a := map[string]bool{}
		b, _ := os.ReadFile(filepath.Join(root, file))
		fence := false
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "```") {
				fence = !fence
			}
			if h, ok := strings.CutPrefix(l, "#"); ok && !fence {
				a[headingAnchor(strings.TrimLeft(h, "#"))] = true
			}
		}
		anchors[file] = a
		return a
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		fence := false
		for n, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "```") {
				fence = !fence
			}
			if fence {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				if file == "" {
					file = f
				} else {
					file = filepath.Join(filepath.Dir(f), file)
				}
				if _, err := os.Stat(filepath.Join(root, file)); err != nil {
					t.Errorf("%s:%d: link %s: %v", f, n+1, target, err)
					continue
				}
				if anchor != "" && strings.HasSuffix(file, ".md") && !anchorsOf(file)[anchor] {
					t.Errorf("%s:%d: link %s: %s has no heading with anchor #%s", f, n+1, target, file, anchor)
				}
			}
		}
	}
	if checked < 30 {
		t.Fatalf("only %d links checked", checked)
	}
}

// headingAnchor is GitHub's anchor of a heading: lower case, punctuation
// but hyphens and underscores dropped, spaces as hyphens.
func headingAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
