package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `ticketing dev` opens an admin port on every node and prints the one
// export line after which `ticketing status`, `members list` and
// `inspect KEY` need no flags: the line is run by a shell as printed.
func TestDevExportLineServesOperatorCommands(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(binary, "dev", "--base-port", "0", "--dir", filepath.Join(dir, "d"), "--socket", filepath.Join(dir, "s"))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
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
			break
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	if export == "" {
		t.Fatal("dev printed no export line before its ready line")
	}
	for _, v := range []string{"TICKETING_ADMIN_SECRET_FILE=", "TICKETING_TLS_CA=", "TICKETING_CLUSTER_ID=dev"} {
		if !strings.Contains(export, v) {
			t.Errorf("export line without %s: %s", v, export)
		}
	}
	sh := exec.Command("bash", "-e", "-o", "pipefail", "-c", export+"\n"+
		`"$TK" lock --lease 30 --socket "$SOCK" env/k -- sh -c '"$TK" inspect env/k'`+"\n"+
		`"$TK" status`+"\n"+`"$TK" members list`+"\n")
	sh.Dir = t.TempDir() // not dev's directory: the line works from anywhere
	sh.Env = append(withoutEnv(os.Environ(), "TICKETING_ADMIN", "TICKETING_ADMIN_SECRET_FILE", "TICKETING_TLS_CA",
		"TICKETING_CLUSTER_ID"), "TK="+binary, "SOCK="+filepath.Join(dir, "s"))
	out, err := sh.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", export, err, out)
	}
	for _, want := range []string{"Key:          env/k", "token ", "(leader, serving)", "3 of 3 votes answer", "commit index "} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output without %q:\n%s", want, out)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
}
