package main

import (
	"bufio"
	"io"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `ticketing lock --verbose` says on stderr when its ACQUIRE is queued
// behind a holder (the sidecar's QUEUED event), before COMMAND runs; the
// holder's release then lets COMMAND run. A block says so for its keys.
// No such line for --wait 0 or a free key.
func TestLockVerboseSaysQueued(t *testing.T) {
	sock := startDevSidecar(t)
	for _, tc := range []struct {
		keys []string
		want string
	}{
		{[]string{"v/1"}, "ticketing lock: queued on v/1 (waiting up to 30s)"},
		{[]string{"v/2", "v/1"}, "ticketing lock: queued on block v/2 v/1 (waiting up to 30.5s)"},
	} {
		hold, _ := holdLock(t, sock, "v/1")
		wait := "30"
		if len(tc.keys) > 1 {
			wait = "30.5"
		}
		args := append(append([]string{"lock", "--verbose", "--socket", sock, "--wait", wait}, tc.keys...), "--", "echo", "ran")
		cmd := exec.Command(binary, args...)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stdout strings.Builder
		cmd.Stdout = &stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		lines := make(chan string, 16)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		// The line comes while the holder still holds: the waiter is in line.
		select {
		case l, ok := <-lines:
			if !ok || l != tc.want {
				t.Fatalf("%v: stderr %q (open %v), want %q", tc.keys, l, ok, tc.want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%v: no queued line within 30s", tc.keys)
		}
		if err := hold.Process.Signal(syscall.SIGINT); err != nil { // releases
			t.Fatal(err)
		}
		if err := hold.Wait(); err != nil {
			t.Fatalf("acquire --hold after SIGINT: %v", err)
		}
		// After it, only the place-in-line lines of a version-7 sidecar,
		// for the keys asked.
		var rest []string
		for l := range lines {
			if !isPositionLine(l, tc.keys) {
				rest = append(rest, l)
			}
		}
		if err := cmd.Wait(); err != nil || stdout.String() != "ran\n" || len(rest) != 0 {
			t.Fatalf("%v: %v, stdout %q, more stderr %q", tc.keys, err, stdout.String(), rest)
		}
	}
	// Not queued: nothing said.
	hold, _ := holdLock(t, sock, "v/3")
	defer func() { _ = hold.Process.Signal(syscall.SIGINT); _ = hold.Wait() }() // cleanup
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"--wait", "0", "v/3"}, 75},
		{[]string{"--wait", "5", "v/4"}, 0},
	} {
		cmd := exec.Command(binary, append(append([]string{"lock", "--verbose", "--socket", sock}, tc.args...), "--", "true")...)
		var errb strings.Builder
		cmd.Stderr, cmd.Stdout = &errb, io.Discard
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || strings.Contains(errb.String(), "queued") {
			t.Fatalf("%v: exit %d (want %d), stderr %q", tc.args, code, tc.code, errb.String())
		}
	}
}

// positionLine is lock --verbose's place-in-line line (clients/README.md,
// "Shell").
var positionLine = regexp.MustCompile(`^ticketing lock: position [1-9][0-9]* in line for (\S+) \((about [0-9]+s|no estimate yet)\)$`)

func isPositionLine(l string, keys []string) bool {
	m := positionLine.FindStringSubmatch(l)
	return m != nil && slices.Contains(keys, m[1])
}
