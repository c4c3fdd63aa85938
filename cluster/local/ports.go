package local

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// ListenLoopback listens on a free TCP port of 127.0.0.1 below the
// kernel's ephemeral port range. A node that stops and starts again keeps
// its ports (the Raft configuration names the peer address), and a port
// from the ephemeral range can be handed to any process's outgoing
// connection while the node is down, so its restart would fail with
// EADDRINUSE (seen when the whole test suite ran at once). Ports below the
// range are only ever taken by an explicit bind. Where the range is not
// known, it listens on port 0.
func ListenLoopback() (net.Listener, error) {
	low := ephemeralLow()
	const first = 10000 // clear of the well-known and usual service ports
	if low-first < 1000 {
		return net.Listen("tcp", "127.0.0.1:0")
	}
	start := first + rand.IntN(low-first)
	var err error
	for i := 0; i < 100; i++ {
		port := first + (start-first+i*7919)%(low-first)
		var ln net.Listener
		if ln, err = net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			return ln, nil
		}
	}
	return nil, err
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux:
// net.ipv4.ip_local_port_range), 0 if unknown.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return low
}
