package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
)

// readmeSection returns the lines of docs/operations.md's section titled
// title (up to the next "## " heading): the sections that were the
// README's "Replacing a node" and "Status and inspection".
func readmeSection(t *testing.T, title string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "## ") {
			in = strings.HasPrefix(l, "## "+title)
			continue
		}
		if in {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		t.Fatalf("docs/operations.md has no section %q", title)
	}
	return out
}

// normalize blanks out what differs between clusters (server ids,
// addresses, numbers, column padding) so the README's sample output can
// be compared with real output.
func normalize(l string) string {
	l = regexp.MustCompile(`[A-Za-z0-9._-]+/[a-z0-9]{10}`).ReplaceAllString(l, "ID")
	l = regexp.MustCompile(`[0-9.]+:[0-9]+`).ReplaceAllString(l, "ADDR")
	l = regexp.MustCompile(`\b[0-9]+\b`).ReplaceAllString(l, "N")
	l = regexp.MustCompile(`\bof n[0-9]+\b|\bof [A-Za-z0-9._-]+ \(`).ReplaceAllString(l, "of NAME (")
	return strings.Join(strings.Fields(l), " ")
}

// The README's own `members` lines work as written (only the addresses and
// files are this test cluster's): M="ticketing members FLAGS..." then
// `$M list` and `$M replace OLD NEW ADDR` (flags before the command), and
// the usage line's order (flags after the command and its arguments).
// The README's sample `list` output, for a node wiped and restarted empty
// at its old address, matches the real one line for line (ids, addresses
// and numbers aside), including the repair command, which then works.
func TestREADMEMembersLines(t *testing.T) {
	sec := readmeSection(t, "Replacing a node")
	var mLine string
	var uses [][]string // the $M lines, fields after $M
	for _, l := range sec {
		if v, ok := strings.CutPrefix(l, `M="ticketing members `); ok {
			mLine = strings.TrimSuffix(v, `"`)
		}
		if v, ok := strings.CutPrefix(l, "$M "); ok {
			v, _, _ = strings.Cut(v, "#")
			uses = append(uses, strings.Fields(v))
		}
	}
	if mLine == "" || len(uses) != 2 || uses[0][0] != "list" || uses[1][0] != "replace" || len(uses[1]) != 4 {
		t.Fatalf("README's members lines changed: M=%q uses=%q", mLine, uses)
	}

	// A cluster with the documented cluster id ("prod", as the example
	// configuration file sets it), TLS and an admin port.
	dir := t.TempDir()
	secret := []byte("the-admin-secret-for-the-readme-test")
	c, err := local.Start(local.Options{Dir: filepath.Join(dir, "c"), TLS: true, AdminSecret: secret,
		Tune: func(cfg *cluster.Config) { local.FastRaft(cfg); cfg.ClusterID = "prod" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	secretPath := filepath.Join(dir, "admin.secret")
	if err := os.WriteFile(secretPath, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for i := 0; i < c.Size(); i++ {
		addrs = append(addrs, c.AdminAddr(i))
	}
	values := map[string]string{"--admin": strings.Join(addrs, ","), "--admin-secret-file": secretPath, "--tls-ca": c.CAFile,
		"--cluster-id": "prod"}
	m := strings.Fields(mLine)
	var flags []string
	for i := 0; i < len(m); i += 2 {
		v, ok := values[m[i]]
		if !ok || i+1 >= len(m) {
			t.Fatalf("README's M line has flag %q this test does not know", m[i])
		}
		flags = append(flags, m[i], v)
	}
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(append([]string{"members"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}

	if code, out, errs := run(append(slices.Clone(flags), "list")...); code != ExitOK || strings.Count(out, " yes ") != 3 {
		t.Fatalf("$M list: exit %d\n%s%s", code, out, errs)
	}
	// n2 loses its disk and comes back empty at its address.
	oldID := c.Node(1).ServerID()
	if err := c.Wipe(1); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(1); err != nil {
		t.Fatal(err)
	}
	newID := c.Node(1).ServerID()
	code, out, errs := run(append(slices.Clone(flags), "list")...)
	if code != ExitOK {
		t.Fatalf("$M list with a wiped node: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("$M list:\n%s", out)
	repair := "  ticketing members replace " + oldID + " " + newID + " " + c.PeerAddrOf(1)
	if !slices.Contains(strings.Split(out, "\n"), repair) {
		t.Fatalf("list does not print the repair command %q:\n%s", repair, out)
	}
	// The README's sample output, in the block after "$ $M list".
	var sample []string
	for i, l := range sec {
		if l == "$ $M list" {
			for _, s := range sec[i+1:] {
				if strings.HasPrefix(s, "```") {
					break
				}
				sample = append(sample, s)
			}
		}
	}
	got := strings.Split(strings.TrimRight(out, "\n"), "\n")
	norm := func(ls []string) []string {
		var out []string
		for _, l := range ls {
			out = append(out, normalize(l))
		}
		// Table rows follow server ids, which differ; compare them as a set.
		slices.Sort(out[1:4])
		return out
	}
	if len(sample) != len(got) || !slices.Equal(norm(sample), norm(got)) {
		t.Fatalf("README's sample list output drifted from the real one:\nREADME:\n%s\nnormalized %q\nreal:\n%s\nnormalized %q",
			strings.Join(sample, "\n"), norm(sample), out, norm(got))
	}

	// status shows the same health and the same repair.
	var sb, eb bytes.Buffer
	code = Main(append([]string{"status"}, flags...), &sb, &eb)
	if code != ExitOK || !strings.Contains(sb.String(), "\n"+repair+"\n") || !strings.Contains(sb.String(), "  no  ") {
		t.Fatalf("status with a wiped node: exit %d\n%s%s", code, sb.String(), eb.String())
	}

	// $M replace OLD NEW ADDR, as the README writes it (flags first).
	code, out, errs = run(append(slices.Clone(flags), "replace", oldID, newID, c.PeerAddrOf(1))...)
	if code != ExitOK || !strings.Contains(out, "done: "+newID+" is a voter") {
		t.Fatalf("$M replace: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("$M replace:\n%s", out)
	// The usage line's order: flags after the command and its arguments;
	// and mixed. Replace again is a no-op; list shows the repair done.
	if code, out, errs := run(append([]string{"replace", oldID, newID, c.PeerAddrOf(1)}, flags...)...); code != ExitOK || !strings.Contains(out, "done") {
		t.Fatalf("members replace OLD NEW ADDR FLAGS: exit %d\n%s%s", code, out, errs)
	}
	mixed := append(append([]string{flags[0], flags[1], "list"}, flags[2:]...), "--timeout", "30s")
	if code, out, errs := run(mixed...); code != ExitOK || strings.Count(out, " yes ") != 3 || strings.Contains(out, oldID) {
		t.Fatalf("members FLAG list FLAGS after the repair: exit %d\n%s%s", code, out, errs)
	}

	// The README's status sample (healthy) has the real member table
	// header and summary line.
	sb.Reset()
	if code := Main(append([]string{"status"}, flags...), &sb, &eb); code != ExitOK {
		t.Fatalf("status: exit %d\n%s", code, eb.String())
	}
	printed := map[string]bool{}
	for _, l := range strings.Split(sb.String(), "\n") {
		printed[normalize(l)] = true
	}
	checked := 0
	for _, l := range readmeSection(t, "Status and inspection") {
		if strings.HasPrefix(l, "SERVER ID") || strings.Contains(l, "votes answer") {
			checked++
			if !printed[normalize(l)] {
				t.Errorf("README's status sample line %q is not in the real output:\n%s", l, sb.String())
			}
		}
	}
	if checked != 2 {
		t.Errorf("README's status sample: %d of its header and summary lines found, want 2", checked)
	}
}

// `members -h` documents the replacement rule; bad command lines exit 2.
func TestMembersUsage(t *testing.T) {
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := Main(append([]string{"members"}, args...), &out, &errb)
		return code, out.String() + errb.String()
	}
	code, out := run("-h")
	if code != ExitOK || !strings.Contains(out, "The replacement rule") || !strings.Contains(out, "remove OLD first") ||
		!strings.Contains(out, "in one step") || !strings.Contains(out, "-admin-secret-file") {
		t.Fatalf("members -h: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{nil, {"explode"}, {"replace", "a/aaaaaaaaaa"}, {"list", "extra"}, {"--nope", "list"}} {
		if code, out := run(args...); code != ExitUsage {
			t.Errorf("members %q: exit %d, want %d\n%s", args, code, ExitUsage, out)
		}
	}
	// Everything after -- is an argument.
	if code, out := run("--admin", "127.0.0.1:1", "--", "list", "--admin"); code != ExitUsage || !strings.Contains(out, "want 0 arguments") {
		t.Fatalf("members --admin A -- list --admin: exit %d\n%s", code, out)
	}
}
