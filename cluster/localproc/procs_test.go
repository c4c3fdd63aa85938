package localproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// TestPids starts a cluster whose node and sidecar processes are stand-ins
// (sleep, through Options.Command; an identity file in node 1's data dir
// skips bootstrap) and checks that Pid and SidecarPid name the running
// processes, and 0 once they are stopped.
func TestPids(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep executable")
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "n1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "n1", "identity"), []byte("n1/1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Start(Options{Binary: sleep, Dir: dir, Nodes: 3, Sidecars: 1,
		Command: func(name string, args []string) (string, []string) { return sleep, []string{"60"} }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	seen := map[int]bool{}
	check := func(what string, pid int) {
		t.Helper()
		if pid <= 0 || seen[pid] {
			t.Fatalf("%s: pid %d (seen %v)", what, pid, seen)
		}
		seen[pid] = true
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("%s: pid %d: %v", what, pid, err)
		}
	}
	for i := 0; i < p.Size(); i++ {
		check(p.ID(i), p.Pid(i))
	}
	check("sidecar1", p.SidecarPid(0))
	if err := p.SignalSidecar(0, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if pid := p.SidecarPid(0); pid != 0 {
		t.Errorf("stopped sidecar: pid %d, want 0", pid)
	}
	if err := p.Signal(1, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if pid := p.Pid(1); pid != 0 {
		t.Errorf("stopped node: pid %d, want 0", pid)
	}
}

// TestNodePortsHeldUntilItStarts: node 1 starts only after the other nodes
// and the bootstrap, and its ports must stay taken meanwhile, or another
// test process picking ports from the same range could bind one first (node
// 1 then never listens and the cluster never elects; CI saw it once). The
// stand-in bootstrap connects to node 1's client and peer ports: they
// accept although node 1 has not started.
func TestNodePortsHeldUntilItStarts(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep executable")
	}
	dir := t.TempDir()
	bootstrap := filepath.Join(dir, "bootstrap.sh")
	script := `#!/bin/bash
[ "$1" = bootstrap ] || { echo "not a bootstrap: $*"; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
  --client-addr|--peer-addr)
    port=${2##*:}
    if ! (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then echo "$1 $2: nobody listens during the bootstrap"; exit 1; fi
    shift;;
  esac
  shift
done
echo "tokens start above: 7"
`
	if err := os.WriteFile(bootstrap, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	p, err := Start(Options{Binary: bootstrap, Dir: dir, Nodes: 3,
		Command: func(name string, args []string) (string, []string) { return sleep, []string{"60"} }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.TokenFloor != 7 {
		t.Fatalf("token floor %d: the stand-in bootstrap did not run to its end", p.TokenFloor)
	}
}
