package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
)

// lock's arguments: one key with or without the --, as always; several
// keys end at the first --, and the command's own -- stays its own.
func TestLockArgs(t *testing.T) {
	for _, tc := range []struct {
		args, keys, argv string
	}{
		{"k -- cmd a", "k", "cmd a"},
		{"k cmd a", "k", "cmd a"},
		{"k -- git diff -- f", "k", "git diff -- f"},
		{"k --", "k", ""},
		{"k", "k", ""},
		{"k1 k2 k3 -- cmd a", "k1 k2 k3", "cmd a"},
		{"k1 k2 -- git diff -- f", "k1 k2", "git diff -- f"},
		{"k1 k2 --", "k1 k2", ""},
		{"", "", ""},
	} {
		keys, argv := lockArgs(strings.Fields(tc.args))
		if !slices.Equal(keys, strings.Fields(tc.keys)) || !slices.Equal(argv, strings.Fields(tc.argv)) {
			t.Errorf("lockArgs(%q) = %q, %q; want %q, %q", tc.args, keys, argv, tc.keys, tc.argv)
		}
	}
}

// Bad block arguments are refused before the socket is tried, with the
// reason and the usage.
func TestLockBlockArguments(t *testing.T) {
	many := strings.Fields("a b c d e f g h i j k l m n o p q")
	for _, tc := range []struct {
		args []string
		why  string
	}{
		{[]string{"lock", "k1", "k2", "--"}, `ticketing lock: want a COMMAND to run after the KEYs ["k1" "k2"]`},
		{[]string{"lock", "k1", "k1", "--", "true"}, `ticketing lock: KEY "k1" named twice`},
		{append(append([]string{"lock"}, many...), "--", "true"), "ticketing lock: 17 KEYs: a block has at most 16"},
		{[]string{"acquire", "k1", "k2", "k1"}, `ticketing acquire: KEY "k1" named twice`},
		{append([]string{"acquire"}, many...), "ticketing acquire: want one KEY (or up to 16, a block), got 17 arguments"},
	} {
		code, out, errs := runMain(tc.args...)
		if code != ExitLockUsage || out != "" || !strings.HasPrefix(errs, tc.why) || !strings.Contains(errs, "\nusage: ") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 64 and %q, then the usage", tc.args, code, out, errs, tc.why)
		}
	}
}

// devSidecar runs `ticketing dev` (3 real nodes and a real sidecar, in
// this process) on free ports for the test and returns its socket.
func devSidecar(t *testing.T) string {
	t.Helper()
	sdir, err := os.MkdirTemp("", "tkl") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sdir) })
	sock := filepath.Join(sdir, "s")
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- runDev(ctx, []string{"--base-port", "0", "--dir", filepath.Join(t.TempDir(), "d"), "--socket", sock}, pw, &errb)
		_ = pw.Close()
	}()
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for said := false; sc.Scan(); {
			if strings.Contains(sc.Text(), "ready") && !said {
				said = true
				close(ready)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-ready:
	case code := <-done:
		t.Fatalf("ticketing dev exited %d before ready:\n%s", code, errb.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("ticketing dev not ready within 60s:\n%s", errb.String())
	}
	return sock
}

// runLockT runs `ticketing lock` in process (its COMMAND a real child
// process) and returns its exit code, stdout and stderr.
func runLockT(args ...string) (int, string, string) {
	var out, errb syncBuffer
	code := runLock(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// --extend-every keeps the lock past its lease while the command runs: the
// key stays busy for others after the first lease, and the release at the
// end is confirmed (the command's own code passed on).
func TestLockExtendEvery(t *testing.T) {
	sock := devSidecar(t)
	key := fmt.Sprintf("lockext/%d", time.Now().UnixNano())
	res := make(chan [3]any, 1)
	go func() {
		code, out, errs := runLockT("--socket", sock, "--lease", "2", "--wait", "0", "--extend-every", "500ms",
			key, "--", "sh", "-c", "sleep 3.5; echo done; exit 7")
		res <- [3]any{code, out, errs}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := ticketing.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Past the first lease (2 s from the grant): still held.
	time.Sleep(2800 * time.Millisecond)
	if _, err := c.Acquire(ctx, key, 10*time.Second, 0); !errors.Is(err, ticketing.ErrBusy) {
		t.Fatalf("%s after its first lease: %v, want ErrBusy (extended)", key, err)
	}
	var r [3]any
	select {
	case r = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("lock did not return")
	}
	if code, out, errs := r[0].(int), r[1].(string), r[2].(string); code != 7 || out != "done\n" {
		t.Fatalf("exit %d (want 7, the command's), stdout %q, stderr %q", code, out, errs)
	}
}

// With renewal off a command outliving its lease loses the lock: it gets
// SIGTERM, and lock exits ExitLost.
func TestLockLostSignalsCommand(t *testing.T) {
	sock := devSidecar(t)
	key := fmt.Sprintf("locklost/%d", time.Now().UnixNano())
	code, out, errs := runLockT("--socket", sock, "--lease", "1", "--wait", "0", "--no-extend", key, "--", "sh", "-c",
		`sleep 60 & p=$!; trap 'kill $p; echo got TERM; exit 3' TERM; echo started; wait`)
	if code != ExitLost || out != "started\ngot TERM\n" || !strings.Contains(errs, "lost (") || !strings.Contains(errs, "SIGTERM") {
		t.Fatalf("exit %d (want %d), stdout %q, stderr %q", code, ExitLost, out, errs)
	}
	if strings.Contains(errs, "SIGKILL\n") {
		t.Fatalf("SIGKILL for a command that stopped on SIGTERM: %q", errs)
	}
}

// A command that ignores SIGTERM is killed after --kill-grace.
func TestLockLostKillsStubbornCommand(t *testing.T) {
	sock := devSidecar(t)
	key := fmt.Sprintf("lockkill/%d", time.Now().UnixNano())
	code, out, errs := runLockT("--socket", sock, "--lease", "1", "--wait", "0", "--extend-every", "0", "--kill-grace", "300ms", key, "--", "sh", "-c",
		`trap '' TERM; echo started; while :; do sleep 0.1; done`)
	if code != ExitLost || out != "started\n" || !strings.Contains(errs, "after SIGTERM: SIGKILL") ||
		!strings.Contains(errs, fmt.Sprintf("exited with %d", 128+int(syscall.SIGKILL))) {
		t.Fatalf("exit %d (want %d), stdout %q, stderr %q", code, ExitLost, out, errs)
	}
}

// By default lock renews the lease at a third of it: a command that runs
// for several leases keeps the lock, others find the key busy past the
// first lease, and lock exits with the command's code.
func TestLockKeepsItsLeaseByDefault(t *testing.T) {
	sock := devSidecar(t)
	key := fmt.Sprintf("lockkeep/%d", time.Now().UnixNano())
	res := make(chan [3]any, 1)
	go func() {
		code, out, errs := runLockT("--socket", sock, "--lease", "2", "--wait", "0",
			key, "--", "sh", "-c", "sleep 5; echo done; exit 9")
		res <- [3]any{code, out, errs}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := ticketing.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Past the first lease (2 s from the grant): still held.
	time.Sleep(3 * time.Second)
	if _, err := c.Acquire(ctx, key, 10*time.Second, 0); !errors.Is(err, ticketing.ErrBusy) {
		t.Fatalf("%s after its first lease: %v, want ErrBusy (renewed)", key, err)
	}
	var r [3]any
	select {
	case r = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("lock did not return")
	}
	if code, out, errs := r[0].(int), r[1].(string), r[2].(string); code != 9 || out != "done\n" || errs != "" {
		t.Fatalf("exit %d (want 9, the command's), stdout %q, stderr %q (want nothing)", code, out, errs)
	}
}

// The renewal period: a third of the lease unless set; 0 or --no-extend
// is never.
func TestLockExtendInterval(t *testing.T) {
	var auto, off, ten extendEvery
	if err := off.Set("0"); err != nil {
		t.Fatal(err)
	}
	if err := ten.Set("10s"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		e     extendEvery
		lease time.Duration
		noExt bool
		want  time.Duration
	}{
		{auto, 60 * time.Second, false, 20 * time.Second},
		{auto, 2 * time.Second, false, 2 * time.Second / 3},
		{auto, 60 * time.Second, true, 0},
		{off, 60 * time.Second, false, 0},
		{ten, 60 * time.Second, false, 10 * time.Second},
	} {
		if got := tc.e.interval(tc.lease, tc.noExt); got != tc.want {
			t.Errorf("%v.interval(%v, %v) = %v, want %v", tc.e.String(), tc.lease, tc.noExt, got, tc.want)
		}
	}
	if got := auto.String(); got != "auto" {
		t.Errorf("default --extend-every prints %q, want auto", got)
	}
}

// --extend-every must leave room before the lease's local deadline;
// --kill-grace is not negative.
func TestLockExtendArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		why  string
	}{
		{[]string{"lock", "--lease", "2", "--extend-every", "2s", "k", "--", "true"}, "ticketing lock: --extend-every 2s: want auto, 0 (off) or at most half the lease less its margin (865ms for --lease 2), so that a renewal may fail and the next still lands in time"},
		// Accepted before issue 42: 0.02 s before the lock's deadline, no
		// room for a renewal to fail or be slow.
		{[]string{"lock", "--lease", "3", "--extend-every", "2.7s", "k", "--", "true"}, "ticketing lock: --extend-every 2.7s: want auto, 0 (off) or at most half the lease less its margin (1.36s for --lease 3)"},
		{[]string{"lock", "--no-extend", "--extend-every", "5s", "k", "--", "true"}, "ticketing lock: --no-extend and --extend-every 5s: give one of them"},
		{[]string{"lock", "--extend-every", "often", "k", "--", "true"}, "ticketing lock: invalid value \"often\" for flag -extend-every: want a duration such as 10s, 0 (off) or auto"},
		{[]string{"lock", "--lease", "2", "--extend-every", "1.8s", "k", "--", "true"}, "ticketing lock: --extend-every 1.8s:"},
		{[]string{"lock", "--extend-every", "-1s", "k", "--", "true"}, "ticketing lock: --extend-every -1s:"},
		{[]string{"lock", "--kill-grace", "-1s", "k", "--", "true"}, "ticketing lock: --kill-grace -1s:"},
		{[]string{"lock", "--extend-every", "10", "k", "--", "true"}, "ticketing lock: invalid value"},
	} {
		code, out, errs := runMain(tc.args...)
		if code != ExitLockUsage || out != "" || !strings.HasPrefix(errs, tc.why) || !strings.Contains(errs, "\nusage: ") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 64 and %q, then the usage", tc.args, code, out, errs, tc.why)
		}
	}
}

// The longest --extend-every a lease takes is accepted: it gets as far as
// dialling the sidecar (here none: 69).
func TestLockExtendEveryAtItsBound(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	code, _, errs := runMain("lock", "--socket", sock, "--lease", "3", "--extend-every", "1.36s", "k", "--", "true")
	if code != ExitUnavailable {
		t.Fatalf("--lease 3 --extend-every 1.36s: exit %d, stderr %q; want 69 (accepted, no sidecar)", code, errs)
	}
}

// A key the protocol refuses is a usage error (64, with the usage line;
// inspect, an admin command, 2)
// found before the sidecar is dialled: the same with no sidecar running,
// where it used to be 69 (the key was checked only once connected).
func TestKeysCheckedBeforeDialling(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	long := strings.Repeat("k", 256)
	for _, args := range [][]string{
		{"acquire", "--socket", sock, "bad key"},
		{"acquire", "--socket", sock, "ok", long},
		{"lock", "--socket", sock, "tab\tkey", "--", "true"},
		{"lock", "--socket", sock, "--permit", "é", "--", "true"},
		{"release", "--socket", sock, "bad key", "7"},
		{"permits", "set", "--socket", sock, "bad key", "3"},
		{"inspect", "--admin", "127.0.0.1:1", "bad key"},
	} {
		want := ExitLockUsage
		if args[0] == "inspect" {
			want = 2 // the admin commands' usage code
		}
		code, out, errs := runMain(args...)
		if code != want || out != "" || !strings.Contains(errs, "want 1 to 255 bytes of visible ASCII") || !strings.Contains(errs, "\nusage: ") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d, the key's rule and the usage", args, code, out, errs, want)
		}
	}
}

// The client commands' exit codes tell "fix your command" (64) from
// "retry later" (69) from the other errors (78).
func TestClientExitCodes(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("ticketing lock: k: %w", err) }
	for _, tc := range []struct {
		err  error
		want int
	}{
		{ticketing.ErrBusy, ExitBusy},
		{ticketing.ErrTimeout, ExitTimeout},
		{ticketing.ErrIndeterminate, ExitIndeterminate},
		{fmt.Errorf("%w: key of 300 bytes (1..255)", ticketing.ErrInvalidArgument), ExitLockUsage},
		{&ticketing.Error{Code: "invalid_key", Message: "bad byte"}, ExitLockUsage},
		{&ticketing.Error{Code: "invalid_lease", Message: "x"}, ExitLockUsage},
		{fmt.Errorf("%w at /x: no socket file there", ticketing.ErrNoSidecar), ExitUnavailable},
		{&ticketing.Error{Code: "unavailable", Message: "no serving leader"}, ExitUnavailable},
		{&ticketing.Error{Code: "moved", Message: `leader is "" at ""`}, ExitUnavailable},
		{&ticketing.Error{Code: "no_quorum", Message: "x"}, ExitUnavailable},
		{&ticketing.Error{Code: "shutting_down", Message: "x"}, ExitUnavailable},
		{&ticketing.Error{Code: "too_many_connections", Message: "x"}, ExitUnavailable},
		{fmt.Errorf("%w: EOF", ticketing.ErrClosed), ExitUnavailable},
		{&ticketing.Error{Code: "not_held", Message: "x"}, ExitLockError},
		{&ticketing.Error{Code: "forbidden", Message: "x"}, ExitLockError},
		{&ticketing.Error{Code: "too_many_waiters", Message: "x"}, ExitLockError},
		{errors.New("something else"), ExitLockError},
	} {
		for _, err := range []error{tc.err, wrap(tc.err)} {
			if got := clientExit(err); got != tc.want {
				t.Errorf("clientExit(%v) = %d, want %d", err, got, tc.want)
			}
		}
	}
}

// "lock [flags] -- sleep 20" names no KEY: the "--" ends the flags, and
// the command's name was taken for the KEY ("sleep" locked, "20" run:
// exit 78, exec: "20" not found). It is a usage error that says so; a
// "--" that is a flag's value, or a second "--" after the KEYs, keeps
// its meaning.
func TestLockNoKeyBeforeDashes(t *testing.T) {
	none := filepath.Join(t.TempDir(), "none.sock")
	code, out, errs := runMain("lock", "--socket", none, "--lease", "5", "--", "sleep", "20")
	if code != ExitLockUsage || out != "" || !strings.HasPrefix(errs, `ticketing lock: no KEY before "--"`) || !strings.Contains(errs, "\nusage: ") {
		t.Errorf("lock -- sleep 20: exit %d, stdout %q, stderr %q; want 64, no KEY before \"--\", then the usage", code, out, errs)
	}
	for _, args := range [][]string{
		{"lock", "--socket", none, "--", "-k", "--", "true"},     // a KEY that starts with "-"
		{"lock", "--socket", none, "--label", "--", "k", "true"}, // "--" is the label
		{"lock", "--socket", none, "--verbose", "k", "--", "true"},
	} {
		if code, _, errs := runMain(args...); code != ExitUnavailable {
			t.Errorf("%q: exit %d, stderr %q; want 69 (the arguments are fine, no sidecar)", args, code, errs)
		}
	}
}

// A bad --label is refused naming the rule it breaks (the message once
// listed every rule, ending in `not "-"`, whatever the label was).
func TestLockLabelMessages(t *testing.T) {
	for _, tc := range []struct{ label, why string }{
		{"-", `--label "-": "-" alone stands for "no label"`},
		{"a b", `--label "a b": want visible ASCII only`},
		{"é", `--label "é": want visible ASCII only`},
		{strings.Repeat("l", 65), "65 bytes; want at most 64"},
	} {
		code, _, errs := runMain("lock", "--label", tc.label, "k", "--", "true")
		if code != ExitLockUsage || !strings.Contains(errs, tc.why) || strings.Contains(errs, `not "-"`) {
			t.Errorf("--label %q: exit %d, stderr %q; want 64 and %q", tc.label, code, errs, tc.why)
		}
	}
}
