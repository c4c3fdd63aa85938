package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/cmd/internal/isolation"
)

// Issue 20: one local client cannot starve its sidecar's others. Each
// hostile case of cmd/internal/isolation runs against its own `ticketing
// dev` (a separate process: the 10,000 connections of the idle case need
// file descriptors on both ends), while a well-behaved client on its own
// connection acquires and releases free keys before, during and after it,
// and holds mine/1 through each phase:
//   - flood: 300 connections each pipelining 200 `ACQUIRE hot/1 250 300`,
//     never reading (before the fix the good client got `ERR unavailable
//     wire: too many requests in flight` for every request);
//   - slowread: the same, the flood reading 16 bytes every 100 ms;
//   - releases: 300 connections pipelining RELEASEs of locks they do not
//     hold (the good client's keys among them);
//   - idle: 10,000 connections that connect and never send.
//
// Every request of the good client is granted (no ERR, BUSY or TIMEOUT),
// its mine/1 is still held under its token at the end of each phase (its
// own HELD says so, and its RELEASE succeeds), and the flood reads only
// replies the protocol documents (the release flood: not_held, answered
// without touching anybody's lock). Latencies are logged, not asserted
// (tests do not assert speed): `ticketlab bench isolation` measures the
// ratios against the targets.
func TestIsolationUnderHostileLocalClients(t *testing.T) {
	documented := documentedReplies(t)
	for _, c := range isolation.Cases {
		t.Run(string(c), func(t *testing.T) {
			o := isolation.DefaultOptions("")
			if err := isolation.CheckFileLimit(c, o); err != nil {
				t.Fatal(err) // not a skip: the case is part of the contract
			}
			dc := startDev(t)
			o.Socket = dc.sock
			o.Probe = func() string {
				if st, ok := dc.leaderStatus(t); ok {
					return fmt.Sprintf("leader %s: %d keys held, %d waiters queued", st.NodeID, st.Held, st.Waiting)
				}
				return "no serving leader"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			res, err := isolation.Run(ctx, c, o)
			t.Logf("%s: %s", c, c.Describe(o))
			for _, p := range res.Phases {
				t.Logf("  good client %v", p)
			}
			t.Logf("  at the end of the flood: %s", res.Probe)
			t.Logf("  the flood read: %s", floodSummary(res))
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Phases) != 3 {
				t.Fatalf("%d phases ran, want before, during and after", len(res.Phases))
			}
			if probs := res.Problems(); len(probs) > 0 {
				var show []string
				for _, p := range res.Phases {
					for i, s := range p.Problems {
						if i == 3 {
							show = append(show, fmt.Sprintf("%s: ... %d more", p.Name, len(p.Problems)-3))
							break
						}
						show = append(show, p.Name+": "+s)
					}
				}
				t.Errorf("%s: %d requests of the well-behaved client were not answered as a free key is (every one must be granted, its lock untouched):\n  %s",
					c, len(probs), strings.Join(show, "\n  "))
			}
			for kind, n := range res.Flood {
				switch {
				case c == isolation.Releases && kind != "ERR not_held":
					t.Errorf("release flood: %d × %q (%s), want only ERR not_held (answered by the sidecar, no lock touched)", n, kind, res.FloodExample[kind])
				case !documented[kind] || kind == "ERR internal":
					t.Errorf("%s: the flood read %d × %q (%s), a reply unixapi/PROTOCOL.md does not document", c, n, kind, res.FloodExample[kind])
				}
			}
		})
	}
}

// documentedReplies is every reply kind (isolation.Kind) PROTOCOL.md's
// "Errors" table names, plus OK.
func documentedReplies(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../../unixapi/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{"OK": true}
	for _, row := range testkit.MarkdownTable(t, string(b), "## Errors") {
		_, code, ok := strings.Cut(row[0], "`")
		code, _, _ = strings.Cut(code, "`")
		if !ok || code == "" {
			t.Fatalf("error table row %q: no `code`", row)
		}
		if strings.HasPrefix(row[0], "—") { // a whole-line word: BUSY, TIMEOUT, INDETERMINATE
			kinds[code] = true
		} else {
			kinds["ERR "+code] = true
		}
	}
	if !kinds["BUSY"] || !kinds["ERR too_many_waiters"] {
		t.Fatalf("PROTOCOL.md's error table read as %v", kinds)
	}
	return kinds
}

func floodSummary(res isolation.Result) string {
	if len(res.Flood) == 0 {
		return "nothing"
	}
	var parts []string
	for k, n := range res.Flood {
		parts = append(parts, fmt.Sprintf("%d × %s", n, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
