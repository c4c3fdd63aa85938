package cli

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fakeSidecar serves one scripted sidecar on a unix socket: answer gives
// the lines to write for each request line (events, then the reply). The
// real sidecar of this tree does not send POSITION yet (its side is built
// apart), and a fake one can send exactly the reports a test needs.
type fakeSidecar struct {
	path string
	mu   sync.Mutex
	reqs []string
}

func newFakeSidecar(t *testing.T, answer func(line string) []string) *fakeSidecar {
	t.Helper()
	dir, err := os.MkdirTemp("", "tkp") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeSidecar{path: filepath.Join(dir, "s")}
	ln, err := net.Listen("unix", f.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				sc := bufio.NewScanner(nc)
				for sc.Scan() {
					f.mu.Lock()
					f.reqs = append(f.reqs, sc.Text())
					f.mu.Unlock()
					if _, err := nc.Write([]byte(strings.Join(answer(sc.Text()), "\n") + "\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return f
}

func (f *fakeSidecar) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.reqs...)
}

// positionsSidecar answers a version-7 HELLO and queues every ACQUIRE
// with the reports of reports (per key of the request), then grants it.
func positionsSidecar(hello string, reports func(keys []string) []string) func(string) []string {
	return func(line string) []string {
		f := strings.Fields(line)
		switch f[0] {
		case "HELLO":
			return []string{hello}
		case "ACQUIRE":
			keys := f[1 : len(f)-2]
			out := []string{"! QUEUED 2 " + strings.Join(keys, " ")}
			return append(append(out, reports(keys)...), "OK 7")
		}
		return []string{"OK"} // EXTEND, RELEASE
	}
}

// `ticketing lock --verbose` prints, after its queued line, one line per
// change of its place in line or of the estimate (a repeat is not
// printed; "-" is no estimate yet), in the documented format, before
// COMMAND runs; a block's per key. Without --verbose it says nothing.
func TestLockVerbosePrintsPositions(t *testing.T) {
	one := newFakeSidecar(t, positionsSidecar("HELLO 7 events", func(keys []string) []string {
		return []string{"! POSITION 2 12 - k", "! POSITION 2 12 34 k", "! POSITION 2 12 34 k", "! POSITION 2 x 1 k",
			"! POSITION 3 1 1 k", "! POSITION 2 2 5 other", "! POSITION 2 1 0 k"}
	}))
	code, out, errs := runLockT("--verbose", "--socket", one.path, "--wait", "30", "k", "--", "echo", "ran")
	want := "ticketing lock: queued on k (waiting up to 30s)\n" +
		"ticketing lock: position 12 in line for k (no estimate yet)\n" +
		"ticketing lock: position 12 in line for k (about 34s)\n" +
		"ticketing lock: position 1 in line for k (about 0s)\n"
	if code != 0 || out != "ran\n" || errs != want {
		t.Fatalf("exit %d, stdout %q, stderr:\n%s\nwant:\n%s", code, out, errs, want)
	}
	if r := one.requests(); len(r) < 2 || r[0] != "HELLO 9 events" || r[1] != "ACQUIRE k 60 30.000" {
		t.Fatalf("requests %q", r)
	}

	blk := newFakeSidecar(t, positionsSidecar("HELLO 7 events", func(keys []string) []string {
		return []string{"! POSITION 2 3 - s/2", "! POSITION 2 2 - s/1", "! POSITION 2 1 4 s/1"}
	}))
	code, out, errs = runLockT("--verbose", "--socket", blk.path, "--wait", "30", "s/2", "s/1", "--", "echo", "ran")
	want = "ticketing lock: queued on block s/2 s/1 (waiting up to 30s)\n" +
		"ticketing lock: position 3 in line for s/2 (no estimate yet)\n" +
		"ticketing lock: position 2 in line for s/1 (no estimate yet)\n" +
		"ticketing lock: position 1 in line for s/1 (about 4s)\n"
	if code != 0 || out != "ran\n" || errs != want {
		t.Fatalf("block: exit %d, stdout %q, stderr:\n%s\nwant:\n%s", code, out, errs, want)
	}

	code, out, errs = runLockT("--socket", one.path, "--wait", "30", "k", "--", "echo", "ran")
	if code != 0 || out != "ran\n" || errs != "" {
		t.Fatalf("without --verbose: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// lock --help documents the position line.
func TestLockHelpSaysPositions(t *testing.T) {
	_, out, errs := runMain("lock", "--help")
	help := out + errs
	for _, s := range []string{"ticketing lock: position P in line for KEY (about Ss)",
		"ticketing lock: position P in line for KEY (no estimate yet)"} {
		if !strings.Contains(help, s) {
			t.Errorf("lock --help does not say %q:\n%s", s, help)
		}
	}
}
