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

// Owner labels end to end, as an operator meets them: against `ticketing
// dev`, `ticketing lock --label job-42 KEY -- COMMAND` holds KEY, a second
// `ticketing lock --label waiter-7` queues on it, and `ticketing inspect
// KEY`, with nothing but dev's export line, names both: the holder's
// Label line and the waiter's LABEL column (and --json's label fields).
// The holder's end then hands the key to the waiter.
func TestDevInspectShowsLabels(t *testing.T) {
	dir, export := startDocDev(t)
	sock := filepath.Join(dir, "ticketing.sock")
	const key = "labels/report"
	holder := exec.Command(binary, "lock", "--label", "job-42", "--lease", "30", "--socket", sock, key,
		"--", "sh", "-c", `echo "$TICKETING_TOKEN"; exec sleep 60`)
	holderOut, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	holder.Stderr = os.Stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	guard := time.AfterFunc(60*time.Second, func() { holder.Process.Kill() }) // hang guard
	defer guard.Stop()
	tok, err := bufio.NewReader(holderOut).ReadString('\n')
	if err != nil {
		t.Fatalf("the holder's COMMAND printed no token: %q %v", tok, err)
	}
	tok = strings.TrimSpace(tok)

	waiter := exec.Command(binary, "lock", "--verbose", "--label", "waiter-7", "--wait", "60", "--socket", sock, key,
		"--", "echo", "ran")
	waiterErr, err := waiter.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var waiterOut strings.Builder
	waiter.Stdout = &waiterOut
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { waiter.Process.Kill(); waiter.Wait() })
	wsc := bufio.NewScanner(waiterErr)
	if !wsc.Scan() || !strings.Contains(wsc.Text(), "queued on "+key) {
		t.Fatalf("the waiter's first stderr line %q, want its queued line", wsc.Text())
	}
	go func() {
		for wsc.Scan() {
		}
	}()

	sh := exec.Command("bash", "-e", "-o", "pipefail", "-c", export+"\n"+
		`"$TK" inspect "$KEY"`+"\n"+`echo ---`+"\n"+`"$TK" inspect --json "$KEY"`+"\n")
	sh.Dir = t.TempDir()
	sh.Env = append(withoutEnv(os.Environ(), "TICKETING_ADMIN", "TICKETING_ADMIN_SECRET_FILE", "TICKETING_TLS_CA",
		"TICKETING_CLUSTER_ID"), "TK="+binary, "KEY="+key)
	out, err := sh.CombinedOutput()
	if err != nil {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	text, js, _ := strings.Cut(string(out), "---\n")
	var holderLine, labelLine, header, row string
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		switch {
		case strings.HasPrefix(l, "Holder:"):
			holderLine = l
		case strings.HasPrefix(l, "Label:"):
			labelLine = l
		case len(f) > 2 && f[0] == "#":
			header = l
		case len(f) > 2 && f[0] == "1":
			row = l
		}
	}
	if !strings.Contains(holderLine, "token "+tok) || strings.Join(strings.Fields(labelLine), " ") != "Label: job-42" {
		t.Errorf("holder %q, label %q, want token %s and label job-42:\n%s", holderLine, labelLine, tok, text)
	}
	if hf, rf := strings.Fields(header), strings.Fields(row); len(hf) < 3 || hf[1] != "OWNER" || hf[2] != "LABEL" ||
		len(rf) < 3 || rf[2] != "waiter-7" {
		t.Errorf("queue header %q, row %q, want a LABEL column with waiter-7:\n%s", header, row, text)
	}
	for _, want := range []string{`"label":"job-42"`, `"label":"waiter-7"`} {
		if !strings.Contains(strings.ReplaceAll(js, " ", ""), want) {
			t.Errorf("inspect --json without %s:\n%s", want, js)
		}
	}

	// The holder ends (SIGTERM reaches its COMMAND): the waiter is granted.
	if err := holder.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait() // its exit code is the lock command's business (lock_test)
	if err := waiter.Wait(); err != nil || waiterOut.String() != "ran\n" {
		t.Fatalf("the waiter after the holder ended: %v, stdout %q", err, waiterOut.String())
	}
}
