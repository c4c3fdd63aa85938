package compare

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"ticketing/cmd/ticketlab/internal/floor"
)

// Floors are the floors measured in the run, before the first system
// (internal/floor): what the disk and what hashicorp/raft itself allow.
type Floors struct {
	// Disk is the disk floor; nil when it failed (see the notes).
	Disk *DiskFloor `json:"disk,omitempty"`
	// Library is the library floor; nil when it failed.
	Library *LibraryFloor `json:"library,omitempty"`
}

// DiskFloor is the disk floor as `ticketlab bench disk` computes it:
// Stores stores appending at once, a commit being a leader append then a
// follower append.
type DiskFloor struct {
	// LogStore is bolt or wal.
	LogStore string `json:"log_store"`
	// Stores is how many stores appended at once; EntryBytes each entry's
	// size; Appends how many appends completed in Seconds.
	Stores     int     `json:"stores"`
	EntryBytes int     `json:"entry_bytes"`
	Appends    int     `json:"appends"`
	Seconds    float64 `json:"seconds"`
	// AppendP50ms, AppendP99ms and AppendP999ms: one append's latency.
	AppendP50ms  float64 `json:"append_p50_ms"`
	AppendP99ms  float64 `json:"append_p99_ms"`
	AppendP999ms float64 `json:"append_p999_ms"`
	// CommitMs is the least a commit takes: 2 × the append p50.
	CommitMs float64 `json:"commit_ms"`
	// HandoffsPerS bounds a contended key's hand-offs: 1 ÷ CommitMs.
	HandoffsPerS float64 `json:"handoffs_per_s"`
}

// LibraryFloor is the library floor: 3 in-process hashicorp/raft nodes
// over loopback TCP, sequential applies from one goroutine on the leader.
type LibraryFloor struct {
	// LogStore is bolt or wal.
	LogStore string `json:"log_store"`
	// Nodes, EntryBytes: the cluster's size and each entry's; Commits
	// applies completed in Seconds.
	Nodes      int     `json:"nodes"`
	EntryBytes int     `json:"entry_bytes"`
	Commits    int     `json:"commits"`
	Seconds    float64 `json:"seconds"`
	// CommitP50ms, CommitP99ms and CommitP999ms: one apply, proposed until
	// committed and applied on the leader.
	CommitP50ms  float64 `json:"commit_p50_ms"`
	CommitP99ms  float64 `json:"commit_p99_ms"`
	CommitP999ms float64 `json:"commit_p999_ms"`
	// CycleMs is the floor under one client's acquire+release: 2 × the
	// commit p50.
	CycleMs float64 `json:"cycle_ms"`
}

// floorStores is how many stores append at once in the disk floor: the
// nodes of the one-box clusters measured.
const floorStores = 3

// measureFloors measures both floors on kind stores in dir (removed
// afterwards), each for d, printing them; a floor that fails is left out
// with a note.
func measureFloors(ctx context.Context, kind, dir string, d time.Duration, out io.Writer, notes *[]string) *Floors {
	defer os.RemoveAll(dir)
	f := &Floors{}
	fmt.Fprintf(out, "floors (%s log store, %v each)\n", kind, d)
	if df, err := floor.Disk(ctx, kind, filepath.Join(dir, "disk"), floorStores, d); err != nil {
		*notes = append(*notes, fmt.Sprintf("disk floor not measured: %v", err))
		fmt.Fprintf(out, "floor: disk: %v\n", err)
	} else {
		f.Disk = &DiskFloor{LogStore: kind, Stores: df.Stores, EntryBytes: floor.DiskEntryBytes, Appends: df.Append.N,
			Seconds: df.Elapsed.Seconds(), AppendP50ms: ms(df.Append.P50), AppendP99ms: ms(df.Append.P99),
			AppendP999ms: ms(df.Append.P999), CommitMs: ms(df.Commit()), HandoffsPerS: df.HandoffsPerS()}
		fmt.Fprintf(out, "floor: disk, %d %s stores appending at once: append p50 %v p99 %v; a commit ≥ %v, so one key ≤ %.0f hand-offs/s\n",
			df.Stores, kind, df.Append.P50, df.Append.P99, df.Commit(), df.HandoffsPerS())
	}
	if ctx.Err() != nil {
		return f
	}
	if lf, err := floor.Library(ctx, kind, filepath.Join(dir, "library"), d); err != nil {
		*notes = append(*notes, fmt.Sprintf("library floor not measured: %v", err))
		fmt.Fprintf(out, "floor: library: %v\n", err)
	} else {
		f.Library = &LibraryFloor{LogStore: kind, Nodes: floor.LibraryNodes, EntryBytes: floor.LibraryEntryBytes,
			Commits: lf.Commit.N, Seconds: lf.Elapsed.Seconds(), CommitP50ms: ms(lf.Commit.P50), CommitP99ms: ms(lf.Commit.P99),
			CommitP999ms: ms(lf.Commit.P999), CycleMs: ms(lf.Cycle())}
		fmt.Fprintf(out, "floor: library, %d hashicorp/raft nodes on loopback TCP (%s): commit p50 %v p99 %v; one client's cycle ≥ %v\n",
			floor.LibraryNodes, kind, lf.Commit.P50, lf.Commit.P99, lf.Cycle())
	}
	return f
}

// tailClients is the client count whose p99 ÷ p50 results.md shows (issue
// 17's tail target); the largest measured stands in when it was not run.
const tailClients = 64

// floorsSection writes results.md's "Floors" section: the floors, then
// the runs measured against them.
func (r *Report) floorsSection(b *bytes.Buffer) {
	f := r.Floors
	if f == nil {
		return
	}
	b.WriteString("## Floors\n\n")
	fmt.Fprintf(b, "Measured in this run before the first system was started, on the disk of the nodes' data dirs, %g s each, log store `%s` (internal/floor):\n\n",
		r.Config.FloorDurationS, r.Config.LogStore)
	b.WriteString("| floor | what is timed | p50 ms | p99 ms | p99.9 ms | bound |\n| --- | --- | ---: | ---: | ---: | --- |\n")
	if d := f.Disk; d != nil {
		fmt.Fprintf(b, "| disk | one append of a %d-byte entry, %d %s stores appending at once (%d appends) | %s | %s | %s | a commit ≥ a leader append + a follower append = %s ms: one key ≤ **%.0f hand-offs/s** |\n",
			d.EntryBytes, d.Stores, d.LogStore, d.Appends, f2(d.AppendP50ms), f2(d.AppendP99ms), f2(d.AppendP999ms), f2(d.CommitMs), d.HandoffsPerS)
	} else {
		b.WriteString("| disk | not measured (see the notes) | | | | |\n")
	}
	if l := f.Library; l != nil {
		fmt.Fprintf(b, "| library | one `raft.Apply` of a %d-byte entry on the leader, waited for, one after another: %d in-process hashicorp/raft nodes over loopback TCP, %s stores, trivial FSM (%d commits) | %s | %s | %s | one client's acquire+release ≥ 2 commits = **%s ms** |\n",
			l.EntryBytes, l.Nodes, l.LogStore, l.Commits, f2(l.CommitP50ms), f2(l.CommitP99ms), f2(l.CommitP999ms), f2(l.CycleMs))
	} else {
		b.WriteString("| library | not measured (see the notes) | | | | |\n")
	}
	b.WriteString("\n")

	var rows []string
	if d := f.Disk; d != nil && has(r.Config.Workloads, Contended) {
		for _, n := range r.Config.Clients {
			row, any := fmt.Sprintf("| %d |", n), false
			for _, s := range r.Config.Systems {
				if x, ok := r.find(s, Contended, n); ok {
					row += fmt.Sprintf(" %s (%.0f/s) |", ratio(x.OpsPerS, d.HandoffsPerS), x.OpsPerS)
					any = true
				} else {
					row += " – |"
				}
			}
			if any {
				rows = append(rows, row)
			}
		}
		if len(rows) > 0 {
			fmt.Fprintf(b, "Contended hand-offs/s ÷ the disk floor's %.0f/s (issue 17: Ticketing ≥ 0.90×):\n\n| clients |", d.HandoffsPerS)
			for _, s := range r.Config.Systems {
				fmt.Fprintf(b, " %s |", s)
			}
			b.WriteString("\n| ---: |" + strings.Repeat(" ---: |", len(r.Config.Systems)) + "\n" + strings.Join(rows, "\n") + "\n\n")
		}
	}

	if l := f.Library; l != nil && has(r.Config.Workloads, Uncontended) {
		zk, zkOK := r.find("zookeeper", Uncontended, 1)
		rows = nil
		for _, s := range r.Config.Systems {
			x, ok := r.find(s, Uncontended, 1)
			if !ok {
				continue
			}
			vsZK := "–"
			if zkOK {
				vsZK = ratio(x.P50ms, zk.P50ms)
			}
			rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s |", s, f2(x.P50ms), ratio(x.P50ms, l.CycleMs), vsZK))
		}
		if len(rows) > 0 {
			fmt.Fprintf(b, "One client, uncontended: cycle p50 ÷ the library floor's %s ms (issue 17: Ticketing ≤ 1.15×), and ÷ ZooKeeper's one-client p50:\n\n", f2(l.CycleMs))
			b.WriteString("| system | cycle p50 ms | ÷ library floor | ÷ zookeeper |\n| --- | ---: | ---: | ---: |\n" + strings.Join(rows, "\n") + "\n\n")
		}
	}

	tail := 0
	for _, n := range r.Config.Clients {
		if n == tailClients || (tail != tailClients && n > tail) {
			tail = n
		}
	}
	rows = nil
	for _, s := range r.Config.Systems {
		row, any := "| "+s+" |", false
		for _, w := range r.Config.Workloads {
			if x, ok := r.find(s, w, tail); ok {
				row += fmt.Sprintf(" %s |", ratio(x.P99ms, x.P50ms))
				any = true
			} else {
				row += " – |"
			}
		}
		if any {
			rows = append(rows, row)
		}
	}
	if len(rows) > 0 {
		fmt.Fprintf(b, "Cycle p99 ÷ p50 at %d clients (issue 17: ≤ 3× at 64):\n\n| system |", tail)
		for _, w := range r.Config.Workloads {
			fmt.Fprintf(b, " %s |", w)
		}
		b.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(r.Config.Workloads)) + "\n" + strings.Join(rows, "\n") + "\n\n")
	}
}
