package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runDevUntilReady starts `ticketing dev ARGS`, waits for its ready line,
// stops it with SIGINT (Ctrl-C) and returns its stdout and stderr.
func runDevUntilReady(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"dev"}, args...)...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer deadline.Stop()
	var out strings.Builder
	sc := bufio.NewScanner(pipe)
	ready := false
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), ": ready in ") {
			ready = true
			break
		}
	}
	if !ready {
		cmd.Wait()
		t.Fatalf("dev %q never printed its ready line\nstdout:\n%s\nstderr:\n%s", args, out.String(), errb.String())
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dev %q after SIGINT: %v\nstderr:\n%s", args, err, errb.String())
	}
	return out.String(), errb.String()
}

// `dev --dir D --base-port 0` survives a restart (the ports are kept in
// D), the normal start and a clean Ctrl-C log no warnings, and another
// --base-port for D is refused with a clear message.
func TestDevRestartOnFreePortsQuiet(t *testing.T) {
	dir := t.TempDir()
	sockDir := shortDir(t)
	args := []string{"--base-port", "0", "--dir", filepath.Join(dir, "d"), "--socket", filepath.Join(sockDir, "s")}
	var addrs []string
	for run := 0; run < 2; run++ {
		out, errs := runDevUntilReady(t, args...)
		if strings.Contains(errs, "level=WARN") || strings.Contains(errs, "level=ERROR") {
			t.Errorf("run %d: dev logged warnings:\n%s", run, errs)
		}
		var got []string
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) == 4 && f[0] == "node" && f[2] == "client" {
				got = append(got, f[3])
			}
		}
		if run == 1 && strings.Join(got, ",") != strings.Join(addrs, ",") {
			t.Errorf("restart on %v, first run on %v", got, addrs)
		}
		addrs = got
	}
	// The quieted warnings are still there at --log-level info.
	if _, errs := runDevUntilReady(t, append(args, "--log-level", "info")...); !strings.Contains(errs, "level=INFO") {
		t.Errorf("--log-level info shows nothing:\n%s", errs)
	}
	// Without --base-port the saved ports are used; another is refused.
	runDevUntilReady(t, "--dir", filepath.Join(dir, "d"), "--socket", filepath.Join(sockDir, "s"))
	cmd := exec.Command(binary, "dev", "--base-port", "17600", "--dir", filepath.Join(dir, "d"), "--socket", filepath.Join(sockDir, "s"))
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "was created with client addresses") ||
		!strings.Contains(string(out), "without --base-port") {
		t.Fatalf("dev on other ports: %v\n%s", err, out)
	}
}

// shortDir is a temporary directory with a short path, for unix sockets
// (sun_path holds 107 bytes; t.TempDir() paths can be longer).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "tk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// A new `dev --dir` runs its nodes on raft-wal without a flag (and with
// --log-store wal); a restart of its --dir keeps that store, and
// --log-store bolt on it is refused with the flag that opens it. A --dir
// created with --log-store bolt (as dev created every --dir before wal
// became the default) stays on bolt when restarted without the flag, dev
// warning once that it does, and --log-store wal on it is refused.
func TestDevOnTheWALStore(t *testing.T) {
	for _, tc := range []struct {
		created     []string // the first run's extra flags
		store       string   // what every node's data dir must hold
		file, other string   // its file, the other store's
	}{
		{nil, "wal", "wal", "raft.db"},
		{[]string{"--log-store", "wal"}, "wal", "wal", "raft.db"},
		{[]string{"--log-store", "bolt"}, "bolt", "raft.db", "wal"},
	} {
		t.Run(strings.Join(append([]string{"created"}, tc.created...), " "), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "d")
			sockDir := shortDir(t)
			args := []string{"--base-port", "0", "--dir", dir, "--socket", filepath.Join(sockDir, "s")}
			if _, errs := runDevUntilReady(t, append(args, tc.created...)...); strings.Contains(errs, "level=ERROR") ||
				strings.Contains(errs, "stays on bolt") {
				t.Errorf("dev %v logged errors or the bolt warning:\n%s", tc.created, errs)
			}
			check := func(when string) {
				t.Helper()
				for _, n := range []string{"n1", "n2", "n3"} {
					if _, err := os.Stat(filepath.Join(dir, n, tc.file)); err != nil {
						t.Fatalf("%s: %s: no %s: %v", when, n, tc.file, err)
					}
					if _, err := os.Stat(filepath.Join(dir, n, tc.other)); err == nil {
						t.Fatalf("%s: %s: a %s beside the %s", when, n, tc.other, tc.file)
					}
				}
			}
			check("created")
			_, errs := runDevUntilReady(t, "--dir", dir, "--socket", filepath.Join(sockDir, "s"))
			check("restarted without --log-store")
			if n, want := strings.Count(errs, "level=WARN msg=\"this --dir holds a cluster on the bolt log store (raft.db): its nodes stay on bolt"),
				map[string]int{"bolt": 1, "wal": 0}[tc.store]; n != want {
				t.Errorf("restarted without --log-store: %d warnings that a node stays on bolt, want %d:\n%s", n, want, errs)
			}
			other := map[string]string{"bolt": "wal", "wal": "bolt"}[tc.store]
			out, err := exec.Command(binary, "dev", "--dir", dir, "--socket", filepath.Join(sockDir, "s"), "--log-store", other).CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "start it with --log-store "+tc.store) {
				t.Fatalf("dev --log-store %s on a %s cluster: %v\n%s", other, tc.store, err, out)
			}
		})
	}
}
