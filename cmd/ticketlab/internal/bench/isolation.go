package bench

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/localproc"
	"ticketing/cmd/internal/isolation"
)

// Issue 20's targets for the well-behaved client while a hostile one is
// there: p50 within 3× of its baseline, p99 within 5×.
const (
	isolationP50Target = 3.0
	isolationP99Target = 5.0
)

func setupIsolation(fs *flag.FlagSet, e *env) func(context.Context) error {
	e.cl = &clusterFlags{}
	e.cl.register(fs, true)
	o := isolation.DefaultOptions("")
	fs.IntVar(&o.Cycles, "cycles", 200, "acquire+release cycles of the well-behaved client in each phase (before, during, after)")
	fs.IntVar(&o.FloodConns, "flood-conns", o.FloodConns, "connections of the flood cases")
	fs.IntVar(&o.FloodDepth, "flood-depth", o.FloodDepth, "requests each flood connection pipelines")
	fs.IntVar(&o.IdleConns, "idle-conns", o.IdleConns, "connections of the idle case")
	cases := fs.String("cases", "flood,slowread,releases,idle", "cases to run, comma separated: flood, slowread, releases, idle")
	return func(ctx context.Context) error {
		var run []isolation.Case
		for _, f := range strings.Split(*cases, ",") {
			c := isolation.Case(strings.TrimSpace(f))
			known := false
			for _, k := range isolation.Cases {
				known = known || k == c
			}
			if !known {
				return usageError(fmt.Sprintf("--cases %q: want some of flood, slowread, releases, idle", *cases))
			}
			run = append(run, c)
		}
		if o.Cycles < 1 || o.FloodConns < 1 || o.FloodDepth < 1 || o.IdleConns < 1 {
			return usageError("--cycles, --flood-conns, --flood-depth and --idle-conns: want at least 1")
		}
		_, err := benchIsolation(ctx, e, run, o)
		return err
	}
}

// isolationRow is one case's line of the summary table.
type isolationRow struct {
	res       isolation.Result
	r50, r99  float64 // during ÷ before
	problems  int
	floodRead string
}

// met reports whether the row meets issue 20's targets: every request of
// the well-behaved client answered as expected, and its latency ratios
// within the targets.
func (r isolationRow) met() (p50, p99 bool) {
	return r.problems == 0 && r.r50 <= isolationP50Target, r.problems == 0 && r.r99 <= isolationP99Target
}

// benchIsolation runs each case on a fresh cluster: node processes and a
// `ticketing sidecar` process, the cases' connections to its socket.
func benchIsolation(ctx context.Context, e *env, cases []isolation.Case, o isolation.Options) ([]isolationRow, error) {
	var rows []isolationRow
	for _, c := range cases {
		if err := isolation.CheckFileLimit(c, o); err != nil {
			return rows, err
		}
		row, err := isolationCase(ctx, e, c, o)
		if err != nil {
			return rows, fmt.Errorf("case %s: %w", c, err)
		}
		rows = append(rows, row)
	}
	fmt.Fprintln(e.stdout, isolationTable(rows))
	return rows, nil
}

func isolationCase(ctx context.Context, e *env, c isolation.Case, o isolation.Options) (isolationRow, error) {
	p, err := localproc.Start(localproc.Options{Binary: *e.cl.binary, Dir: filepath.Join(e.dir, "isolation-"+string(c)), Nodes: e.cl.nodes,
		TLS: e.cl.tls, Sidecars: 1, ExtraArgs: append(append([]string{}, quiet...), strings.Fields(e.cl.nodeArgs)...),
		SidecarArgs: []string{"--log-level", "warn", "--max-conns", fmt.Sprint(o.IdleConns + o.FloodConns + 64)}})
	if err != nil {
		return isolationRow{}, err
	}
	defer p.Close()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	li, err := p.Leader(wctx)
	if err == nil {
		err = ticketing.WaitReady(wctx, p.SidecarSocket(0))
	}
	cancel()
	if err != nil {
		return isolationRow{}, err
	}
	o.Socket = p.SidecarSocket(0)
	o.Probe = func() string { return leaderProbe(ctx, p, li) }
	fmt.Fprintf(e.stdout, "isolation %s: %s\n", c, c.Describe(o))
	res, err := isolation.Run(ctx, c, o)
	for _, ph := range res.Phases {
		fmt.Fprintf(e.stdout, "  good client %v\n", ph)
	}
	if err != nil {
		return isolationRow{}, err
	}
	row := isolationRow{res: res, problems: len(res.Problems()), floodRead: floodKinds(res)}
	before, during := res.Phase("before"), res.Phase("during")
	if b := before.Quantile(0.5); b > 0 {
		row.r50 = float64(during.Quantile(0.5)) / float64(b)
	}
	if b := before.Quantile(0.99); b > 0 {
		row.r99 = float64(during.Quantile(0.99)) / float64(b)
	}
	for i, s := range res.Problems() {
		if i == 3 {
			fmt.Fprintf(e.stdout, "  ... %d more\n", row.problems-3)
			break
		}
		fmt.Fprintf(e.stdout, "  not as expected: %s\n", s)
	}
	fmt.Fprintf(e.stdout, "  at the end of the during phase: %s\n  the hostile client read: %s\n", res.Probe, row.floodRead)
	return row, nil
}

// leaderProbe is the leader's count of held keys and queued waiters.
func leaderProbe(ctx context.Context, p *localproc.Procs, li int) string {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if l, err := p.Leader(sctx); err == nil {
		li = l
	}
	st, err := p.Status(sctx, li)
	if err != nil {
		return "leader status: " + err.Error()
	}
	return fmt.Sprintf("leader %s: %d keys held, %d waiters queued", p.ID(li), st.Held, st.Waiting)
}

func floodKinds(res isolation.Result) string {
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

func isolationTable(rows []isolationRow) string {
	var b strings.Builder
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }
	yes := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	fmt.Fprintf(&b, "\n| case | before p50 / p99 ms | during p50 / p99 ms | after p50 / p99 ms | during ÷ before p50 | p99 | good requests not granted | p50 ≤ %.0f× | p99 ≤ %.0f× |\n",
		isolationP50Target, isolationP99Target)
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n")
	for _, r := range rows {
		ph := func(n string) string {
			p := r.res.Phase(n)
			return ms(p.Quantile(0.5)) + " / " + ms(p.Quantile(0.99))
		}
		m50, m99 := r.met()
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f× | %.2f× | %d | %s | %s |\n", r.res.Case, ph("before"), ph("during"), ph("after"),
			r.r50, r.r99, r.problems, yes(m50), yes(m99))
	}
	b.WriteString("\n(latency: one acquire+release cycle of the well-behaved client; a case with requests not granted misses both targets; during ÷ before is 0 when no cycle completed)")
	return b.String()
}
