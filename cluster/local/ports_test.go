package local

import (
	"net"
	"testing"
)

// Free ports for nodes come from below the ephemeral range, so no
// outgoing connection of any process can hold one while its node is down
// (a restart on it failed with EADDRINUSE when the suite ran at once).
func TestListenLoopbackBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	if low == 0 {
		t.Skip("the kernel's ephemeral port range is not known here")
	}
	for i := 0; i < 20; i++ {
		ln, err := ListenLoopback()
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if port >= low || port < 10000 {
			t.Fatalf("port %d, want 10000 <= port < %d", port, low)
		}
	}
}
