package compare

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"ticketing/cmd/ticketlab/internal/labtest"
)

// TestShortRun runs the Ticketing systems (real node and sidecar processes)
// at 1 and 4 clients for 200 ms per run and checks the three output files.
// With TICKETBENCH_PEERS=1 the peers are measured too (they must be up:
// peers.sh start DIR).
func TestMain(m *testing.M) {
	ServeLineFloorIfAsked() // the line floor's server is this binary, re-executed
	os.Exit(m.Run())
}

func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster; not in -short")
	}
	systems := "ticketing-sidecar,ticketing-broker,line-floor"
	if os.Getenv("TICKETBENCH_PEERS") == "1" {
		systems = strings.Join(AllSystems, ",")
	}
	binary, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{"--binary", binary, "--systems", systems, "--clients", "1,4", "--warmup", "100ms", "--duration", "200ms", "--prewarm", "200ms",
		"--floor-duration", "0", "--out", out}, &stdout, &stderr)
	t.Logf("output:\n%s%s", stdout.String(), stderr.String())
	if code != 0 {
		t.Fatalf("exit code %d", code)
	}

	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	want := len(strings.Split(systems, ",")) * 3 * 2
	if len(rep.Results) != want {
		t.Fatalf("results.json has %d results, want %d", len(rep.Results), want)
	}
	for _, r := range rep.Results {
		if r.Skipped != "" || r.Cycles == 0 || r.OpsPerS <= 0 || r.P50ms <= 0 {
			t.Errorf("bad result %+v", r)
		}
		if r.ExclusionFails != 0 {
			t.Errorf("%s %s %d: %d mutual exclusion failures", r.System, r.Workload, r.Clients, r.ExclusionFails)
		}
		if r.Workload == Contended && r.Clients == 4 && (r.FIFOFraction <= 0 || r.Handoffs == 0) {
			t.Errorf("%s contended: no hand-off or fairness figures: %+v", r.System, r)
		}
		if isTicketing(r.System) {
			checkProcs(t, r)
		}
		if r.System == "line-floor" && (len(r.Procs) != 1 || r.Procs[0].Name != "line-floor" || r.Procs[0].Pid <= 0) {
			t.Errorf("line-floor %s %d: processes %+v, want the line floor's own", r.Workload, r.Clients, r.Procs)
		}
	}
	if rep.Floors != nil {
		t.Errorf("--floor-duration 0 measured floors: %+v", rep.Floors)
	}
	if rep.Machine.CPUs == 0 || len(rep.Systems) == 0 {
		t.Errorf("machine or systems missing: %+v %+v", rep.Machine, rep.Systems)
	}

	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"| ticketing-sidecar | 1 |", "| ticketing-broker | 4 |", "| line-floor | 4 |", "### Contended: hand-off and fairness", "![ops/s by clients](plot.svg)"} {
		if !bytes.Contains(md, []byte(s)) {
			t.Errorf("results.md lacks %q", s)
		}
	}
	checkSVG(t, filepath.Join(out, "plot.svg"), 3*3)
}

// checkProcs checks that a Ticketing run names its server processes: the
// three nodes, one of them the leader, and for ticketing-sidecar the
// sidecar (CPU times are not checked: a short window may see no tick).
func checkProcs(t *testing.T, r Result) {
	t.Helper()
	want := []string{"n1", "n2", "n3"}
	if r.System == "ticketing-sidecar" {
		want = append(want, "sidecar1")
	}
	var names []string
	leaders := 0
	for _, p := range r.Procs {
		names = append(names, p.Name)
		if p.Pid <= 0 || p.CPUms < 0 || p.USPerCycle < 0 {
			t.Errorf("%s %s %d: process %+v", r.System, r.Workload, r.Clients, p)
		}
		if p.Role == "leader" {
			leaders++
		}
	}
	if strings.Join(names, ",") != strings.Join(want, ",") || leaders != 1 || r.CPUNote != "" {
		t.Errorf("%s %s %d: processes %+v (%d leaders), note %q; want %v with one leader", r.System, r.Workload, r.Clients, r.Procs, leaders, r.CPUNote, want)
	}
}

// TestCPUAndFloors runs ticketing-sidecar for one client and a second per
// run, after both floors, with extra node and sidecar flags, and checks
// that every server process's CPU and the harness's were recorded, that
// the floors were measured, and that results.md shows both.
func TestCPUAndFloors(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster; not in -short")
	}
	binary, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{"--binary", binary, "--systems", "ticketing-sidecar", "--clients", "1", "--workloads", "uncontended,contended",
		"--warmup", "200ms", "--duration", "1s", "--prewarm", "0", "--floor-duration", "300ms",
		"--node-args", "--pprof-addr 127.0.0.1:0", "--sidecar-args", "--pprof-addr 127.0.0.1:0", "--out", out}, &stdout, &stderr)
	t.Logf("output:\n%s%s", stdout.String(), stderr.String())
	if code != 0 {
		t.Fatalf("exit code %d", code)
	}
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("results.json has %d results, want 2", len(rep.Results))
	}
	for _, r := range rep.Results {
		if r.Skipped != "" || r.Cycles == 0 {
			t.Fatalf("bad result %+v", r)
		}
		checkProcs(t, r)
		if r.ServerCPUms <= 0 || r.ServerCPUus <= 0 || r.HarnessCPUms <= 0 || r.HarnessCPUus <= 0 {
			t.Errorf("%s: CPU server %v ms (%v µs/cycle), harness %v ms (%v µs/cycle); want all > 0", r.Workload, r.ServerCPUms, r.ServerCPUus, r.HarnessCPUms, r.HarnessCPUus)
		}
		var sum float64
		for _, p := range r.Procs {
			sum += p.CPUms
			if p.Role == "leader" && p.CPUms <= 0 {
				t.Errorf("%s: the leader used no CPU: %+v", r.Workload, p)
			}
		}
		if math.Abs(sum-r.ServerCPUms) > 1e-6 {
			t.Errorf("%s: server CPU %v ms is not the sum of its processes' %v ms", r.Workload, r.ServerCPUms, sum)
		}
		if !strings.Contains(r.Line(), "CPU µs/cycle: server ") {
			t.Errorf("progress line lacks the CPU: %s", r.Line())
		}
	}
	f := rep.Floors
	if f == nil || f.Disk == nil || f.Library == nil {
		t.Fatalf("floors missing: %+v (notes %v)", f, rep.Notes)
	}
	if d := f.Disk; d.LogStore != "wal" || d.Stores != 3 || d.Appends == 0 || d.AppendP50ms <= 0 || d.CommitMs != 2*d.AppendP50ms || d.HandoffsPerS <= 0 {
		t.Errorf("disk floor %+v", d)
	}
	if l := f.Library; l.LogStore != "wal" || l.Nodes != 3 || l.Commits == 0 || l.CommitP50ms <= 0 || l.CycleMs != 2*l.CommitP50ms {
		t.Errorf("library floor %+v", l)
	}
	c := rep.Config
	if c.LogStore != "wal" || strings.Join(c.NodeArgs, " ") != "--pprof-addr 127.0.0.1:0" || strings.Join(c.SidecarArgs, " ") != "--pprof-addr 127.0.0.1:0" {
		t.Errorf("config %+v", c)
	}
	if len(rep.Systems) != 1 || !strings.Contains(rep.Systems[0].Setup, "node flags `--pprof-addr 127.0.0.1:0`") {
		t.Errorf("systems %+v", rep.Systems)
	}
	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"| server CPU µs/cycle |", "## Floors", "| disk | one append", "| library | one `raft.Apply`",
		"Contended hand-offs/s ÷ the disk floor's", "÷ library floor", "Cycle p99 ÷ p50 at 1 clients",
		"## CPU per cycle, per process", "| ticketing-sidecar | contended | 1 | "} {
		if !bytes.Contains(md, []byte(s)) {
			t.Errorf("results.md lacks %q", s)
		}
	}
	if !regexp.MustCompile(`n[123] leader [0-9.]+, `).Match(md) {
		t.Errorf("results.md names no leader's CPU:\n%s", md)
	}
}

// TestTicketingArgs checks the node and sidecar command lines: each store
// is passed as --log-store KIND, bolt too (no flag means wal to a node now,
// bolt to one built before), and the extra flags come last.
func TestTicketingArgs(t *testing.T) {
	o := ticketingOptions{LogStore: "bolt", NodeArgs: []string{"--pprof-addr", "127.0.0.1:0"}, SidecarArgs: []string{"--x"}}
	if got := strings.Join(o.nodeArgs(), " "); got != "--log-level warn --log-store bolt --pprof-addr 127.0.0.1:0" {
		t.Errorf("bolt node args %q", got)
	}
	if got := strings.Join(o.sidecarArgs(), " "); got != "--log-level warn --x" {
		t.Errorf("sidecar args %q", got)
	}
	o.LogStore = "wal"
	if got := strings.Join(o.nodeArgs(), " "); got != "--log-level warn --log-store wal --pprof-addr 127.0.0.1:0" {
		t.Errorf("wal node args %q", got)
	}
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"--log-store", "lsm"}, &stdout, &stderr); code != 2 {
		t.Errorf("--log-store lsm: exit %d, want 2 (%s)", code, stderr.String())
	}
}

// TestProcessCPU reads this process's CPU time and checks the pid files
// peers.sh leaves: one naming this process is accepted, one whose process
// runs another command, or that is missing, is refused.
func TestProcessCPU(t *testing.T) {
	end := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(end) { // burn a few ticks
	}
	if d, err := procCPU(selfPid); err != nil || d <= 0 {
		t.Errorf("procCPU(self) = %v, %v", d, err)
	}
	if clockTicks() <= 0 {
		t.Errorf("clockTicks %d", clockTicks())
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pids"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pids", "me.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	ps, err := peerProcesses(dir, []string{"me"}, strings.TrimSpace(string(comm)))
	if err != nil || len(ps) != 1 || ps[0].Pid != os.Getpid() || ps[0].Name != "me" {
		t.Errorf("peerProcesses = %+v, %v", ps, err)
	}
	if _, err := peerProcesses(dir, []string{"me"}, "etcd"); err == nil {
		t.Error("a pid file of another command was accepted")
	}
	if _, err := peerProcesses(dir, []string{"redis"}, "redis-server"); err == nil {
		t.Error("a missing pid file was accepted")
	}
}

// checkSVG parses the plot and counts its data lines.
func checkSVG(t *testing.T, path string, minLines int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(b))
	root, lines := "", 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("plot.svg does not parse: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			if se.Name.Local == "polyline" {
				lines++
			}
		}
	}
	if root != "svg" {
		t.Fatalf("plot.svg root element %q", root)
	}
	if lines < minLines {
		t.Errorf("plot.svg has %d lines, want at least %d", lines, minLines)
	}
}

// TestReport renders a report from made-up results: ratios and escaping.
func TestReport(t *testing.T) {
	rep := &Report{Config: ReportConfig{Systems: AllSystems, Workloads: AllWorkloads, Clients: []int{1, 16}, DurationS: 1, MixedKeys: MixedKeys, MixedZipfS: MixedZipfS}}
	ops := map[string]float64{"ticketing-sidecar": 300, "ticketing-broker": 400, "etcd": 100, "zookeeper": 150, "redis": 3000, "line-floor": 9000}
	for _, w := range AllWorkloads {
		for _, n := range []int{1, 16} {
			for _, s := range AllSystems {
				rep.Results = append(rep.Results, Result{System: s, Workload: w, Clients: n, OpsPerS: ops[s] * float64(n), Cycles: 10, P50ms: 1, FIFOFraction: 1})
			}
		}
	}
	rep.Results = append(rep.Results, Result{System: "etcd", Workload: Mixed, Clients: 64, Skipped: "boom | <x>"})
	for i := range rep.Results {
		x := &rep.Results[i]
		x.P99ms, x.Seconds = 2.5, 1
		if x.System == "ticketing-sidecar" {
			x.Procs = []ProcCPU{{Name: "n1", Role: "leader", Pid: 7, CPUms: 40, USPerCycle: 39.25}, {Name: "n2", Role: "follower", Pid: 8, CPUms: 30, USPerCycle: 26},
				{Name: "n3", Role: "follower", Pid: 9, CPUms: 30, USPerCycle: 26}, {Name: "sidecar1", Role: "sidecar", Pid: 10, CPUms: 40, USPerCycle: 40.5}}
			x.ServerCPUms, x.ServerCPUus, x.HarnessCPUms, x.HarnessCPUus = 140, 131.75, 60, 30.25
		}
		if x.System == "etcd" && x.Skipped == "" {
			x.CPUNote = "CPU not measured: pid of etcd-1: missing"
		}
		if x.System == "line-floor" {
			x.Procs = []ProcCPU{{Name: "line-floor", Role: "sidecar", Pid: 11, CPUms: 6, USPerCycle: 6}}
			x.ServerCPUms, x.ServerCPUus = 6, 6
		}
	}
	rep.Floors = &Floors{Disk: &DiskFloor{LogStore: "bolt", Stores: 3, EntryBytes: 512, Appends: 100, AppendP50ms: 0.5, CommitMs: 1, HandoffsPerS: 1000},
		Library: &LibraryFloor{LogStore: "bolt", Nodes: 3, EntryBytes: 100, Commits: 100, CommitP50ms: 1.25, CycleMs: 2.5}}
	rep.Config.LogStore = "bolt"
	md := rep.Markdown()
	for _, s := range []string{"| uncontended | 1 | 3.00× | 2.00× | 0.10× | 4.00× | 2.67× | 0.13× |",
		"| ticketing-sidecar | 16 | 4800 | 1.00 | 2.50 | 0.00 | 132 | 0 |",
		"| etcd | 16 | 1600 | 1.00 | 2.50 | 0.00 | – | 0 |",
		"one key ≤ **1000 hand-offs/s**", "= **2.50 ms** |",
		"| 16 | 4.80× (4800/s) | 6.40× (6400/s) | 1.60× (1600/s) | 2.40× (2400/s) | 48.00× (48000/s) |",
		"| ticketing-sidecar | 1.00 | 0.40× | 1.00× |",
		"Cycle p99 ÷ p50 at 16 clients", "| redis | 2.50× | 2.50× | 2.50× |",
		"| ticketing-sidecar | mixed | 16 | 132 | n1 leader 39.2, n2 26.0, n3 26.0, sidecar1 40.5 | 30.2 | 0.20 |",
		"| etcd | uncontended | 1 | – | CPU not measured: pid of etcd-1: missing | | |",
		"## The sidecar against the line floor", "| uncontended | 16 | 40.5 | 6.0 | 6.75× | 4800 | 144000 |"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	dir := t.TempDir()
	if err := rep.Write(dir); err != nil {
		t.Fatal(err)
	}
	checkSVG(t, filepath.Join(dir, "plot.svg"), 3*len(AllSystems))
}
