package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The product binary carries no lab (issue 16): no benchmark, verification,
// process launcher or fault injection is linked into it, and no fault file
// can be obeyed; those live in cmd/ticketlab, its own module. The Debian
// package ships this binary.
func TestBinaryCarriesNoLab(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list -deps named only %d packages", len(deps))
	}
	for _, dep := range deps {
		for _, bad := range []string{
			"porcupine", "etcd.io/etcd", "go.etcd.io/etcd", "zookeeper", "go-zookeeper", "redis", "redsync",
			"ticketing/cluster/verify", "ticketing/cluster/netfault", "ticketing/cluster/localproc",
			"ticketing/cluster/testkit", "ticketing/locksm/scripttest", // test support: they import package testing
			"ticketing/cmd/ticketlab",
			"ticketing/cmd/internal/isolation", // the hostile clients of the isolation test and bench
		} {
			if strings.Contains(dep, bad) {
				t.Errorf("the ticketing binary links %s (%q is lab code)", dep, bad)
			}
		}
		if strings.HasPrefix(dep, "ticketing/") && strings.Contains(dep, "fault") {
			t.Errorf("the ticketing binary links %s (fault code)", dep)
		}
	}
	// cluster/ does not depend on the client libraries.
	out, err = exec.Command("go", "list", "-deps", "ticketing/cluster/...").Output()
	if err != nil {
		t.Fatalf("go list -deps ticketing/cluster/...: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "ticketing/clients") {
			t.Errorf("cluster/ imports %s", dep)
		}
	}
	// Nor can it be told to obey a fault file, nor run the lab's commands.
	for _, args := range [][]string{
		{"node", "--fault-file", "x"},
		{"sidecar", "--fault-file", "x"},
		{"bootstrap", "--fault-file", "x"},
	} {
		b, err := exec.Command(binary, args...).CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(b), "flag provided but not defined: -fault-file") {
			t.Errorf("ticketing %s: %v, want exit 2 for an unknown flag:\n%s", strings.Join(args, " "), err, b)
		}
	}
	for _, cmd := range []string{"bench", "verify"} {
		b, err := exec.Command(binary, cmd).CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(b), "unknown command") {
			t.Errorf("ticketing %s: %v, want exit 2 for an unknown command:\n%s", cmd, err, b)
		}
	}
}
