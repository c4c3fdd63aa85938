// Command skipcheck runs `go test -json` (or reads its output) and makes
// skipped tests visible and checked: `go test` without -v prints nothing
// for a skip and counts none, so a test that skips on the very symptom it
// exists to catch passes in silence.
//
//	go run ./.ci/skipcheck [-allow .ci/allowed-skips] [-C dir] [-v] -- go test -json ./...
//
// It prints what `go test` prints without -v (an "ok" line per package, a
// failed test's whole output and the "FAIL" line, a build's errors), then
// every skipped test with its skip message, and exits non-zero when the
// tests failed, the command failed, or a test skipped that the allowlist
// does not name with the message it skipped with. Without a command it
// reads the JSON from standard input. -v prints every test's output as it
// arrives, as `go test -v` does.
//
// The allowlist (.ci/allowed-skips) has one entry a line, four fields
// separated by " | ": the package's import path, a regular expression
// for the test's name, one for its skip message, and the reason the skip
// is an environment's and not the code's (both expressions must match
// part of the name or message; anchor them to match all of it).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent, with
// the build events of `go test -json` since Go 1.24).
type event struct {
	Action      string
	Package     string
	Test        string
	Elapsed     float64
	Output      string
	FailedBuild string
	ImportPath  string // build-output, build-fail
}

// rule is one allowlist entry.
type rule struct {
	line          int
	pkg           string
	test, message *regexp.Regexp
	reason        string
	used          bool
}

// skip is one skipped test.
type skip struct {
	pkg, test, message string
	rule               *rule // nil: not allowed
}

// errAllowlist reports a malformed allowlist.
var errAllowlist = errors.New("skipcheck: allowlist")

func parseAllowlist(r io.Reader, name string) ([]*rule, error) {
	var rules []*rule
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.SplitN(l, " | ", 4)
		if len(f) != 4 {
			return nil, fmt.Errorf("%w: %s:%d: want 4 fields separated by \" | \" (package | test | message | reason), got %d",
				errAllowlist, name, n, len(f))
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
			if f[i] == "" {
				return nil, fmt.Errorf("%w: %s:%d: field %d is empty", errAllowlist, name, n, i+1)
			}
		}
		test, err := regexp.Compile(f[1])
		if err != nil {
			return nil, fmt.Errorf("%w: %s:%d: test: %w", errAllowlist, name, n, err)
		}
		msg, err := regexp.Compile(f[2])
		if err != nil {
			return nil, fmt.Errorf("%w: %s:%d: message: %w", errAllowlist, name, n, err)
		}
		rules = append(rules, &rule{line: n, pkg: f[0], test: test, message: msg, reason: f[3]})
	}
	return rules, sc.Err()
}

// allow finds the rule that allows s, if any.
func allow(rules []*rule, s skip) *rule {
	for _, r := range rules {
		if r.pkg == s.pkg && r.test.MatchString(s.test) && r.message.MatchString(s.message) {
			r.used = true
			return r
		}
	}
	return nil
}

// framing reports whether an output line is go test's own framing of a
// test ("=== RUN", "--- SKIP: ..."), not something the test printed.
func framing(l string) bool {
	t := strings.TrimLeft(l, " ")
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "--- PASS", "--- FAIL", "--- SKIP"} {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	return false
}

// pkgState is what the checker keeps about one package while it runs.
type pkgState struct {
	out      map[string]*strings.Builder // by test ("": the package's own output)
	failed   []string                    // tests that failed, in order
	failedOK map[string]bool
}

// checker turns the event stream into the report.
type checker struct {
	w       io.Writer
	verbose bool
	rules   []*rule
	pkgs    map[string]*pkgState
	builds  map[string]*strings.Builder // build output by ImportPath
	skips   []skip
	failed  []string // packages (or builds) that failed
	passed  int
}

func newChecker(w io.Writer, rules []*rule, verbose bool) *checker {
	return &checker{w: w, verbose: verbose, rules: rules, pkgs: map[string]*pkgState{}, builds: map[string]*strings.Builder{}}
}

func (c *checker) pkg(name string) *pkgState {
	p := c.pkgs[name]
	if p == nil {
		p = &pkgState{out: map[string]*strings.Builder{}, failedOK: map[string]bool{}}
		c.pkgs[name] = p
	}
	return p
}

// line handles one line of the stream: a JSON event, or anything else
// (printed as it is, as go test would have).
func (c *checker) line(l string) {
	var e event
	if !strings.HasPrefix(l, "{") || json.Unmarshal([]byte(l), &e) != nil {
		fmt.Fprintln(c.w, l)
		return
	}
	switch e.Action {
	case "build-output":
		b := c.builds[e.ImportPath]
		if b == nil {
			b = &strings.Builder{}
			c.builds[e.ImportPath] = b
		}
		b.WriteString(e.Output)
		return
	case "build-fail":
		if b := c.builds[e.ImportPath]; b != nil {
			fmt.Fprint(c.w, b.String())
			delete(c.builds, e.ImportPath)
		}
		return
	}
	if e.Package == "" {
		return
	}
	p := c.pkg(e.Package)
	switch e.Action {
	case "output":
		if c.verbose {
			fmt.Fprint(c.w, e.Output)
		}
		b := p.out[e.Test]
		if b == nil {
			b = &strings.Builder{}
			p.out[e.Test] = b
		}
		b.WriteString(e.Output)
	case "pass":
		if e.Test != "" {
			delete(p.out, e.Test)
			return
		}
		c.passed++
		if !c.verbose {
			if b := p.out[""]; b != nil && strings.Contains(b.String(), "ok  \t") {
				c.printPackageLines(p, func(l string) bool { return strings.HasPrefix(l, "ok  \t") })
			} else {
				fmt.Fprintf(c.w, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
			}
		}
		delete(c.pkgs, e.Package)
	case "skip":
		if e.Test == "" { // no test files, or no tests to run
			if !c.verbose {
				c.printPackageLines(p, func(l string) bool { return strings.HasPrefix(l, "?") || strings.HasPrefix(l, "ok") })
			}
			delete(c.pkgs, e.Package)
			return
		}
		s := skip{pkg: e.Package, test: e.Test, message: skipMessage(p.out[e.Test])}
		s.rule = allow(c.rules, s)
		c.skips = append(c.skips, s)
		delete(p.out, e.Test)
	case "fail":
		if e.Test != "" {
			if !p.failedOK[e.Test] {
				p.failed = append(p.failed, e.Test)
				p.failedOK[e.Test] = true
			}
			return
		}
		c.failed = append(c.failed, e.Package)
		if !c.verbose {
			c.printFailure(e.Package, p)
		}
		delete(c.pkgs, e.Package)
	}
}

// skipMessage is what a skipped test printed, without go test's framing.
func skipMessage(b *strings.Builder) string {
	if b == nil {
		return ""
	}
	var msg []string
	for _, l := range strings.Split(b.String(), "\n") {
		if l = strings.TrimSpace(l); l != "" && !framing(l) {
			msg = append(msg, l)
		}
	}
	return strings.Join(msg, " / ")
}

// printFailure prints a failed package the way go test does without -v:
// the output of every failed test, then of the tests that never ended (a
// panic or a timeout stops the binary in one), then the package's own.
func (c *checker) printFailure(pkg string, p *pkgState) {
	for _, t := range p.failed {
		if b := p.out[t]; b != nil {
			fmt.Fprint(c.w, withoutRunLines(b.String()))
			delete(p.out, t)
		}
	}
	var running []string
	for t := range p.out {
		if t != "" {
			running = append(running, t)
		}
	}
	sort.Strings(running)
	for _, t := range running {
		fmt.Fprint(c.w, withoutRunLines(p.out[t].String()))
	}
	if b := p.out[""]; b != nil {
		fmt.Fprint(c.w, b.String())
	} else {
		fmt.Fprintf(c.w, "FAIL\t%s\n", pkg)
	}
}

// printPackageLines prints the package's own output lines that keep says.
func (c *checker) printPackageLines(p *pkgState, keep func(string) bool) {
	if b := p.out[""]; b != nil {
		for _, l := range strings.SplitAfter(b.String(), "\n") {
			if keep(l) {
				fmt.Fprint(c.w, l)
			}
		}
	}
}

// withoutRunLines drops the "=== RUN"-style lines go test -v adds.
func withoutRunLines(s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if t := strings.TrimLeft(l, " "); !strings.HasPrefix(t, "=== ") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// finish prints the skips and the verdict, and reports whether every
// skip was allowed.
func (c *checker) finish(allowName string) bool {
	// Packages still open when the stream ended (the command was killed).
	var open []string
	for name := range c.pkgs {
		open = append(open, name)
	}
	sort.Strings(open)
	for _, name := range open {
		c.failed = append(c.failed, name)
		c.printFailure(name, c.pkgs[name])
	}
	var bad []skip
	fmt.Fprintf(c.w, "\nskipcheck: %d packages passed, %d failed; %d tests skipped\n", c.passed, len(c.failed), len(c.skips))
	for _, s := range c.skips {
		verdict := "NOT ALLOWED"
		if s.rule != nil {
			verdict = fmt.Sprintf("allowed (%s:%d: %s)", allowName, s.rule.line, s.rule.reason)
		} else {
			bad = append(bad, s)
		}
		fmt.Fprintf(c.w, "SKIP %s %s: %s\n     %s\n", s.pkg, s.test, s.message, verdict)
	}
	if len(bad) > 0 {
		fmt.Fprintf(c.w, "skipcheck: %d skipped tests are not on %s; a test must not skip on what it tests (fix it), "+
			"or add the environment it needs to CI, or allowlist it with the reason:\n", len(bad), allowName)
		for _, s := range bad {
			fmt.Fprintf(c.w, "  %s %s\n", s.pkg, s.test)
		}
		return false
	}
	return true
}

func main() {
	allowName := flag.String("allow", ".ci/allowed-skips", "the allowlist of skips")
	dir := flag.String("C", "", "run the command in this directory")
	verbose := flag.Bool("v", false, "print every test's output as it arrives (go test -v)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: skipcheck [-allow file] [-C dir] [-v] [-- go test -json ...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	os.Exit(run(*allowName, *dir, *verbose, flag.Args()))
}

// run is main without the exit: 0 when everything passed and every skip
// was allowed, 1 otherwise, 2 on a usage or allowlist error.
func run(allowName, dir string, verbose bool, args []string) int {
	f, err := os.Open(allowName)
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipcheck:", err)
		return 2
	}
	rules, err := parseAllowlist(f, allowName)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c := newChecker(os.Stdout, rules, verbose)
	var in io.Reader = os.Stdin
	var cmd *exec.Cmd
	if len(args) > 0 {
		cmd = exec.Command(args[0], args[1:]...)
		cmd.Dir, cmd.Stdin, cmd.Stderr = dir, os.Stdin, os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			fmt.Fprintln(os.Stderr, "skipcheck:", err)
			return 2
		}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "skipcheck:", err)
			return 2
		}
		in = out
	}
	br := bufio.NewReaderSize(in, 1<<16)
	for {
		l, err := br.ReadString('\n')
		if l != "" {
			c.line(strings.TrimSuffix(l, "\n"))
		}
		if err != nil {
			break
		}
	}
	code := 0
	if cmd != nil {
		if err := cmd.Wait(); err != nil {
			fmt.Fprintf(os.Stderr, "skipcheck: %s: %v\n", strings.Join(args, " "), err)
			code = 1
		}
	}
	if !c.finish(allowName) || len(c.failed) > 0 {
		code = 1
	}
	return code
}
