package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"ticketing/cluster/localproc"
)

// Catching a node inside an append reads Linux's /proc (the product is
// Linux-only: unixapi needs SO_PEERCRED).

// walSyscalls are the system calls of a raft-wal append (segment.Writer:
// one pwrite of the batch's frames and its commit frame, then an fsync of
// the segment file), and of a bolt commit, by number.
var walSyscalls = map[int]string{
	syscall.SYS_PWRITE64:  "pwrite64",
	syscall.SYS_FSYNC:     "fsync",
	syscall.SYS_FDATASYNC: "fdatasync",
}

// midAppend looks at every thread of process pid for one blocked inside
// an append to its log store: a walSyscalls call whose file descriptor is
// a wal segment file (DATA-DIR/wal/*.wal) or, on the bolt store, raft.db
// (bolt's commit: a pwrite of the dirty pages, fdatasync, a pwrite of the
// meta page, fdatasync). It returns what it found, or "" for nothing.
func midAppend(pid int) (string, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return "", err
	}
	for _, task := range tasks {
		// "NR ARG0 ... SP PC" while blocked in a system call; "running"
		// or "-1 ..." otherwise.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/syscall", pid, task.Name()))
		if err != nil {
			continue // the thread just ended
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		nr, err := strconv.Atoi(f[0])
		if err != nil || walSyscalls[nr] == "" {
			continue
		}
		fd, err := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 32)
		if err != nil {
			continue
		}
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
		if err != nil || filepath.Ext(target) != ".wal" && filepath.Base(target) != "raft.db" {
			continue
		}
		return fmt.Sprintf("thread %s inside %s of %s", task.Name(), walSyscalls[nr], filepath.Base(target)), nil
	}
	return "", nil
}

// killMidAppend SIGKILLs the nodes victims at a moment when one of them
// is provably inside an append to its wal, and returns the witness. It
// stops them all (SIGSTOP) and looks at their threads (midAppend); if it
// finds one blocked in the pwrite or the fsync of a segment, it kills them
// all while they are stopped; otherwise it resumes them and tries again a
// moment later, at most maxTries times (then t fails). A thread seen
// inside the system call after SIGSTOP was sent can only leave it to
// stop, and SIGKILL ends it there: that write or fsync never returned to
// raft-wal, so the batch it belongs to was never acknowledged. (SIGKILL
// cannot tear the pwrite of a batch in the page cache: the torn tail of a
// power loss is TestWALTornTail's.)
func killMidAppend(t *testing.T, p *localproc.Procs, victims ...int) string {
	t.Helper()
	const maxTries = 3000
	for try := 1; try <= maxTries; try++ {
		for _, i := range victims {
			if err := p.Signal(i, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		}
		var witness string
		for _, i := range victims {
			w, err := midAppend(p.Pid(i))
			if err != nil {
				t.Fatalf("looking inside %s (pid %d) needs /proc/PID/task/*/syscall: %v", p.ID(i), p.Pid(i), err)
			}
			if w != "" {
				witness = fmt.Sprintf("%s: %s (try %d)", p.ID(i), w, try)
				break
			}
		}
		if witness != "" {
			for _, i := range victims {
				if err := p.Signal(i, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			return witness
		}
		for _, i := range victims {
			if err := p.Signal(i, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
	}
	t.Fatalf("in %d tries no node of %v was caught inside an append to its log store", maxTries, victims)
	return ""
}
