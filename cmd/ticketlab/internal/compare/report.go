package compare

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Report is everything results.json holds.
type Report struct {
	Started  string       `json:"started"`
	ElapsedS float64      `json:"elapsed_s"`
	Machine  Machine      `json:"machine"`
	Config   ReportConfig `json:"config"`
	Systems  []SystemInfo `json:"systems"`
	Results  []Result     `json:"results"`
	// Floors were measured before the first system (nil: not measured).
	Floors *Floors  `json:"floors,omitempty"`
	Notes  []string `json:"notes,omitempty"`
}

// ReportConfig is the run's configuration.
type ReportConfig struct {
	Systems           []string `json:"systems"`
	Workloads         []string `json:"workloads"`
	Clients           []int    `json:"clients"`
	WarmupS           float64  `json:"warmup_s"`
	DurationS         float64  `json:"duration_s"`
	PrewarmS          float64  `json:"prewarm_s"`
	TicketingTLS      bool     `json:"ticketing_tls"`
	RedisRetryDelayMs float64  `json:"redis_retry_delay_ms"`
	MixedKeys         int      `json:"mixed_keys"`
	MixedZipfS        float64  `json:"mixed_zipf_s"`
	LeaseS            float64  `json:"lease_s"`
	// LogStore is the Ticketing nodes' and the floors' Raft log store.
	LogStore string `json:"log_store"`
	// NodeArgs and SidecarArgs were appended to the Ticketing command lines.
	NodeArgs    []string `json:"node_args,omitempty"`
	SidecarArgs []string `json:"sidecar_args,omitempty"`
	// FloorDurationS is how long each floor was measured.
	FloorDurationS float64 `json:"floor_duration_s"`
}

// SystemInfo describes one system under test.
type SystemInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Setup   string `json:"setup"`
}

// Machine holds facts about the machine the run was on.
type Machine struct {
	CPUs       int    `json:"cpus"`
	CPUModel   string `json:"cpu_model"`
	MemoryMiB  int    `json:"memory_mib"`
	Kernel     string `json:"kernel"`
	OS         string `json:"os"`
	GoVersion  string `json:"go_version"`
	LoadAvg    string `json:"load_avg_at_start"`
	LoadAvgEnd string `json:"load_avg_at_end,omitempty"`
}

func loadAvg() string {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			return strings.Join(f[:3], " ")
		}
	}
	return ""
}

func machineFacts() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		for _, l := range strings.Split(string(b), "\n") {
			if _, err := fmt.Sscanf(l, "MemTotal: %d kB", &kb); err == nil {
				m.MemoryMiB = kb / 1024
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	m.LoadAvg = loadAvg()
	if out, err := exec.Command("go", "version").Output(); err == nil {
		m.GoVersion = strings.TrimSpace(strings.TrimPrefix(string(out), "go version "))
	}
	return m
}

// Line is a one-line summary of a result, for progress output.
func (r Result) Line() string {
	s := fmt.Sprintf("%-17s %-11s %3d clients: ", r.System, r.Workload, r.Clients)
	if r.Skipped != "" {
		return s + "FAILED: " + r.Skipped
	}
	s += fmt.Sprintf("%8.0f ops/s, cycle p50 %s p99 %s p99.9 %s ms", r.OpsPerS, f2(r.P50ms), f2(r.P99ms), f2(r.P999ms))
	if r.Workload == Contended {
		s += fmt.Sprintf("; hand-off p50 %s p99 %s ms, FIFO %.0f%%, max overtakes %d", f2(r.HandoffP50ms), f2(r.HandoffP99ms), 100*r.FIFOFraction, r.MaxOvertakes)
	}
	if len(r.Procs) > 0 {
		s += fmt.Sprintf("; CPU µs/cycle: server %s (%s), harness %s", f1(r.ServerCPUus), r.procList(), f1(r.HarnessCPUus))
	} else if r.CPUNote != "" {
		s += "; " + r.CPUNote
	}
	if r.Errors > 0 {
		s += fmt.Sprintf("; %d errors (first: %s)", r.Errors, r.FirstError)
	}
	if r.ExclusionFails > 0 {
		s += fmt.Sprintf("; %d MUTUAL EXCLUSION FAILURES", r.ExclusionFails)
	}
	return s + fmt.Sprintf(" [load %.1f]", r.Load1)
}

// procList is the per-process CPU per cycle, "n1 leader 39.2, n2 26.1, …".
func (r Result) procList() string {
	var parts []string
	for _, p := range r.Procs {
		name := p.Name
		if p.Role != "" && p.Role != "follower" && p.Role != "sidecar" {
			name += " " + p.Role
		}
		parts = append(parts, name+" "+f1(p.USPerCycle))
	}
	return strings.Join(parts, ", ")
}

// f1 formats a CPU figure in µs.
func f1(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func f2(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// Write writes results.json, results.md and plot.svg into dir.
func (r *Report) Write(dir string) error {
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"results.json": append(j, '\n'),
		"results.md":   []byte(r.Markdown()),
		"plot.svg":     []byte(r.SVG()),
	}
	for name, b := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p+".tmp", b, 0o644); err != nil {
			return err
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return err
		}
	}
	return nil
}

func (r *Report) find(system, workload string, clients int) (Result, bool) {
	for _, x := range r.Results {
		if x.System == system && x.Workload == workload && x.Clients == clients && x.Skipped == "" {
			return x, true
		}
	}
	return Result{}, false
}

func isTicketing(system string) bool { return strings.HasPrefix(system, "ticketing") }

var peerNames = []string{"etcd", "zookeeper", "redis"}

func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// Markdown renders the report as results.md.
func (r *Report) Markdown() string {
	var b bytes.Buffer
	m := r.Machine
	fmt.Fprintf(&b, "# Ticketing vs etcd, ZooKeeper and Redis: lock benchmark\n\n")
	fmt.Fprintf(&b, "Run %s, %.0f s in all, by `ticketlab compare`. Every system ran on this one machine, "+
		"at the same time as the others (idle while not measured); each system first driven %g s unmeasured, then each run: %g s warm-up, %g s measured. "+
		"Clients, servers and sidecar share the machine's CPUs.\n\n", r.Started, r.ElapsedS, r.Config.PrewarmS, r.Config.WarmupS, r.Config.DurationS)
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), %d MiB, %s, kernel %s, %s; load average at start %s, at end %s "+
		"(each run's 1-minute load is in results.json).\n\n",
		m.CPUs, m.CPUModel, m.MemoryMiB, m.OS, m.Kernel, m.GoVersion, m.LoadAvg, orDash(m.LoadAvgEnd))

	b.WriteString("## Systems\n\n| system | version | setup and durability |\n| --- | --- | --- |\n")
	for _, s := range r.Systems {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", s.Name, orDash(s.Version), strings.ReplaceAll(s.Setup, "|", "\\|"))
	}
	b.WriteString("\nDurable and replicated like Ticketing: etcd and ZooKeeper (3 members, fsync on commit). " +
		"Redis is one node without persistence or replication: a reference for speed, not a like-for-like alternative.\n\n")

	r.floorsSection(&b)

	// Headline ratios.
	var tick []string
	for _, s := range r.Config.Systems {
		if isTicketing(s) {
			tick = append(tick, s)
		}
	}
	if len(tick) > 0 {
		b.WriteString("## Ratios: Ticketing ÷ peer (throughput; above 1× Ticketing is faster)\n\n| workload | clients |")
		var cols [][2]string
		for _, t := range tick {
			for _, p := range peerNames {
				if has(r.Config.Systems, p) {
					cols = append(cols, [2]string{t, p})
					fmt.Fprintf(&b, " %s ÷ %s |", strings.TrimPrefix(t, "ticketing-"), p)
				}
			}
		}
		b.WriteString("\n| --- | ---: |" + strings.Repeat(" ---: |", len(cols)) + "\n")
		for _, w := range r.Config.Workloads {
			for _, n := range r.Config.Clients {
				fmt.Fprintf(&b, "| %s | %d |", w, n)
				for _, c := range cols {
					t, ok1 := r.find(c[0], w, n)
					p, ok2 := r.find(c[1], w, n)
					if ok1 && ok2 {
						fmt.Fprintf(&b, " %s |", ratio(t.OpsPerS, p.OpsPerS))
					} else {
						b.WriteString(" – |")
					}
				}
				b.WriteString("\n")
			}
		}
		b.WriteString("\n(`sidecar`: Ticketing through the `ticketing sidecar` process and its unix socket; " +
			"`broker`: the in-process Broker. Contended: hand-offs/s.)\n\n")
	}

	for _, w := range r.Config.Workloads {
		title := map[string]string{
			Uncontended: "Uncontended: each client acquires and releases its own key",
			Contended:   "Contended: every client on one key (ops/s = hand-offs/s)",
			Mixed:       fmt.Sprintf("Mixed: keys drawn from Zipf(s=%.1f) over %d keys", r.Config.MixedZipfS, r.Config.MixedKeys),
		}[w]
		fmt.Fprintf(&b, "## %s\n\n", title)
		b.WriteString("| system | clients | ops/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/cycle | errors | Ticketing ÷ etcd | Ticketing ÷ zookeeper | Ticketing ÷ redis |\n")
		b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, n := range r.Config.Clients {
			for _, s := range r.Config.Systems {
				x, ok := r.findAny(s, w, n)
				if !ok {
					continue
				}
				if x.Skipped != "" {
					fmt.Fprintf(&b, "| %s | %d | failed: %s | | | | | | | | |\n", s, n, mdCell(x.Skipped))
					continue
				}
				errs := fmt.Sprint(x.Errors)
				if x.ExclusionFails > 0 {
					errs += fmt.Sprintf(" (**%d exclusion failures**)", x.ExclusionFails)
				}
				fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s | %s | %s | %s |", s, n, x.OpsPerS, f2(x.P50ms), f2(x.P99ms), f2(x.P999ms), x.serverCPU(), errs)
				for _, p := range peerNames {
					pr, ok := r.find(p, w, n)
					if isTicketing(s) && ok {
						fmt.Fprintf(&b, " %s |", ratio(x.OpsPerS, pr.OpsPerS))
					} else {
						b.WriteString(" |")
					}
				}
				b.WriteString("\n")
			}
		}
		b.WriteString("\nLatency: one acquire (including any wait) + release cycle. Server CPU: all the system's server processes " +
			"over the measured window ÷ its cycles (grants when contended); ticketing-broker's nodes only, its Broker runs in the harness " +
			"(see \"CPU per cycle, per process\").\n\n")
		if w == Contended {
			b.WriteString("### Contended: hand-off and fairness\n\n")
			b.WriteString("| system | clients | hand-offs/s | hand-off p50 ms | p99 ms | p99.9 ms | told before release returned | release sent → next grant p50 / p99 ms | FIFO grants | overtakes mean / max | longest wait ÷ (clients × mean hand-off) |\n")
			b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
			for _, n := range r.Config.Clients {
				for _, s := range r.Config.Systems {
					x, ok := r.find(s, w, n)
					if !ok {
						continue
					}
					wf := "–"
					if n > 1 {
						wf = fmt.Sprintf("%.2f", x.MaxWaitFactor)
					}
					fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s | %s | %d of %d | %s / %s | %.1f%% | %.2f / %d | %s |\n", s, n, x.OpsPerS,
						f2(x.HandoffP50ms), f2(x.HandoffP99ms), f2(x.HandoffP999ms), x.HandoffEarly, x.Handoffs,
						f2(x.HandoffSentP50ms), f2(x.HandoffSentP99ms),
						100*x.FIFOFraction, x.MeanOvertakes, x.MaxOvertakes, wf)
				}
			}
			b.WriteString("\n" + contendedNotes + "\n")
		}
	}
	r.cpuSection(&b)
	r.lineFloorSection(&b)
	var errNotes []string
	for _, x := range r.Results {
		if x.Errors > 0 && x.FirstError != "" {
			errNotes = append(errNotes, fmt.Sprintf("%s %s %d clients: %d errors, first: %s", x.System, x.Workload, x.Clients, x.Errors, x.FirstError))
		}
	}
	if len(r.Notes)+len(errNotes) > 0 {
		b.WriteString("## Notes\n\n")
		for _, n := range append(append([]string(nil), r.Notes...), errNotes...) {
			fmt.Fprintf(&b, "- %s\n", mdCell(n))
		}
		b.WriteString("\n")
	}
	b.WriteString("![ops/s by clients](plot.svg)\n")
	return b.String()
}

const contendedNotes = `Hand-off: from the moment the holder's release returned success to the moment the next holder's acquire returned, on one monotonic clock in this process (grants paired in the order they returned). When the next holder hears first (the server tells both at once), the difference is negative and counted as 0; the "told before release returned" column counts those. "Release sent → next grant" is the whole hand-off as the two clients see it: from the holder sending its release to the next holder's acquire returning, the release's own commit included.

Fairness: a client *arrives* when it calls acquire (stamped in this process just before the call). A grant is FIFO when no client that arrived earlier was still waiting; overtakes of a grant are the earlier arrivals still waiting when it was granted (0 for a FIFO lock, up to clients−1). Arrivals less than a network round trip apart may reach the server in either order, so a FIFO server can show a few overtakes. Each client's first acquire is left out (all clients start at once, so those reach the server in an arbitrary order, and a queue whose first round outlasts the warm-up would count that order as overtakes). Longest wait ÷ (clients × mean hand-off) is about 1 for a FIFO lock; larger means some client starved for that many rounds (not shown for 1 client).

Mutual exclusion is checked on the same clock (a grant of a key while another client of the run holds it counts as a failure; a holder stops holding when it sends its release).
`

func (r *Report) findAny(system, workload string, clients int) (Result, bool) {
	for _, x := range r.Results {
		if x.System == system && x.Workload == workload && x.Clients == clients {
			return x, true
		}
	}
	return Result{}, false
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func mdCell(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "\\|")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// ---------------------------------------------------------------------------
// SVG: one panel per workload, ops/s (log scale) against clients, one line
// per system.

var systemColors = map[string]string{
	"ticketing-sidecar": "#d62728",
	"ticketing-broker":  "#ff7f0e",
	"etcd":              "#1f77b4",
	"zookeeper":         "#2ca02c",
	"redis":             "#7f7f7f",
}

func xmlEsc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}

// SVG renders plot.svg.
func (r *Report) SVG() string {
	const (
		panelW, panelH = 380.0, 300.0
		left, top      = 70.0, 90.0
		gap            = 50.0
		bottom         = 60.0
	)
	workloads := r.Config.Workloads
	W := left + float64(len(workloads))*(panelW+gap)
	H := top + panelH + bottom + 30
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range r.Results {
		if x.Skipped == "" && x.OpsPerS > 0 {
			lo, hi = math.Min(lo, x.OpsPerS), math.Max(hi, x.OpsPerS)
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	ylo, yhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if yhi <= ylo {
		yhi = ylo + 1
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="16" font-weight="bold">%s</text>`+"\n", left,
		xmlEsc(fmt.Sprintf("Lock throughput (ops/s, log scale) by clients, %d CPUs, %g s per run", r.Machine.CPUs, r.Config.DurationS)))
	// legend
	lx := left
	for _, s := range r.Config.Systems {
		c := systemColors[s]
		fmt.Fprintf(&b, `<line x1="%.0f" y1="42" x2="%.0f" y2="42" stroke="%s" stroke-width="3"/><circle cx="%.0f" cy="42" r="3.5" fill="%s"/>`, lx, lx+24, c, lx+12, c)
		fmt.Fprintf(&b, `<text x="%.0f" y="46">%s</text>`+"\n", lx+30, xmlEsc(s))
		lx += 40 + 7.5*float64(len(s))
	}
	yOf := func(v float64) float64 {
		return top + panelH - (math.Log10(v)-ylo)/(yhi-ylo)*panelH
	}
	for pi, w := range workloads {
		x0 := left + float64(pi)*(panelW+gap)
		fmt.Fprintf(&b, `<g><rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", x0, top, panelW, panelH)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" font-weight="bold">%s</text>`+"\n", x0+panelW/2, top-8, xmlEsc(w))
		for e := ylo; e <= yhi; e++ {
			for _, mult := range []float64{1, 2, 5} {
				v := mult * math.Pow(10, e)
				if math.Log10(v) > yhi+1e-9 {
					continue
				}
				y := yOf(v)
				stroke := "#eee"
				if mult == 1 {
					stroke = "#ccc"
				}
				fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="%s"/>`, x0, y, x0+panelW, y, stroke)
				if pi == 0 || mult == 1 {
					fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end" font-size="10">%s</text>`, x0-4, y+3, humanNum(v))
				}
				b.WriteString("\n")
			}
		}
		n := len(r.Config.Clients)
		xOf := func(i int) float64 {
			if n == 1 {
				return x0 + panelW/2
			}
			return x0 + 30 + float64(i)*(panelW-60)/float64(n-1)
		}
		for i, c := range r.Config.Clients {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%d</text>`+"\n", xOf(i), top+panelH+16, c)
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">clients</text>`+"\n", x0+panelW/2, top+panelH+34)
		if pi == 0 {
			fmt.Fprintf(&b, `<text transform="translate(%.0f %.0f) rotate(-90)" text-anchor="middle">ops/s</text>`+"\n", x0-48, top+panelH/2)
		}
		for _, s := range r.Config.Systems {
			c := systemColors[s]
			var pts []string
			for i, cl := range r.Config.Clients {
				x, ok := r.find(s, w, cl)
				if !ok || x.OpsPerS <= 0 {
					continue
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(i), yOf(x.OpsPerS)))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s</title></circle>`+"\n", xOf(i), yOf(x.OpsPerS), c,
					xmlEsc(fmt.Sprintf("%s %s %d clients: %.0f ops/s, p50 %.2f ms", s, w, cl, x.OpsPerS, x.P50ms)))
			}
			if len(pts) > 1 {
				fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), c)
			}
		}
		b.WriteString("</g>\n")
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="11" fill="#555">%s</text>`+"\n", left, H-10,
		xmlEsc("contended: hand-offs/s. etcd, ZooKeeper, Ticketing: 3 durable replicas (fsync); Redis: 1 node, no persistence."))
	b.WriteString("</svg>\n")
	return b.String()
}

func humanNum(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	default:
		return fmt.Sprintf("%g", v)
	}
}

// MachineFacts is the machine a run is on (results.json's "machine"), for
// the other benchmarks that write results files.
func MachineFacts() Machine { return machineFacts() }

// LoadAvg is the 1-, 5- and 15-minute load averages ("" if unknown).
func LoadAvg() string { return loadAvg() }
