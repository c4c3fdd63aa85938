package compare

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ticketing/cmd/ticketlab/internal/labtest"
)

// TestShortRun runs the Ticketing systems (real node and sidecar processes)
// at 1 and 4 clients for 200 ms per run and checks the three output files.
// With TICKETBENCH_PEERS=1 the peers are measured too (they must be up:
// peers.sh start DIR).
func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster; not in -short")
	}
	systems := "ticketing-sidecar,ticketing-broker"
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
	code := Main(ctx, []string{"--binary", binary, "--systems", systems, "--clients", "1,4", "--warmup", "100ms", "--duration", "200ms", "--prewarm", "200ms", "--out", out}, &stdout, &stderr)
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
	}
	if rep.Machine.CPUs == 0 || len(rep.Systems) == 0 {
		t.Errorf("machine or systems missing: %+v %+v", rep.Machine, rep.Systems)
	}

	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"| ticketing-sidecar | 1 |", "| ticketing-broker | 4 |", "### Contended: hand-off and fairness", "![ops/s by clients](plot.svg)"} {
		if !bytes.Contains(md, []byte(s)) {
			t.Errorf("results.md lacks %q", s)
		}
	}
	checkSVG(t, filepath.Join(out, "plot.svg"), 2*3)
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
	ops := map[string]float64{"ticketing-sidecar": 300, "ticketing-broker": 400, "etcd": 100, "zookeeper": 150, "redis": 3000}
	for _, w := range AllWorkloads {
		for _, n := range []int{1, 16} {
			for _, s := range AllSystems {
				rep.Results = append(rep.Results, Result{System: s, Workload: w, Clients: n, OpsPerS: ops[s] * float64(n), Cycles: 10, P50ms: 1, FIFOFraction: 1})
			}
		}
	}
	rep.Results = append(rep.Results, Result{System: "etcd", Workload: Mixed, Clients: 64, Skipped: "boom | <x>"})
	md := rep.Markdown()
	for _, s := range []string{"| uncontended | 1 | 3.00× | 2.00× | 0.10× | 4.00× | 2.67× | 0.13× |",
		"| ticketing-sidecar | 16 | 4800 | 1.00 |"} {
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
