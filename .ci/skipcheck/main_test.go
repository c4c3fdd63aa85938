package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const testAllowlist = `# comment
example.com/m/a | ^TestEnv$ | no widget | the machine has no widget
`

// checkStream runs the checker on lines and returns its report and verdict.
func checkStream(t *testing.T, lines []string) (string, bool) {
	t.Helper()
	rules, err := parseAllowlist(strings.NewReader(testAllowlist), "allow")
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	c := newChecker(&out, rules, false)
	for _, l := range lines {
		c.line(l)
	}
	ok := c.finish("allow")
	return out.String(), ok && len(c.failed) == 0
}

// writeModule writes a module with a passing, an allowed-skip, a
// hollow-skip and a failing test, and a package that does not build.
func writeModule(t *testing.T, failing bool) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.22\n",
		"a/a_test.go": `package a

import "testing"

func TestPass(t *testing.T) { t.Log("quiet when passing") }
func TestEnv(t *testing.T)  { t.Skip("no widget here") }
`,
	}
	if failing {
		files["a/b_test.go"] = `package a

import "testing"

func TestHollow(t *testing.T) { t.Skipf("leader lost") }
func TestFail(t *testing.T) {
	t.Log("the failing test's log")
	t.Run("sub", func(t *testing.T) { t.Error("the subtest's error") })
}
`
		files["broken/broken.go"] = "package broken\n\nfunc F() int { return \"not an int\" }\n"
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// goTestJSON runs `go test -json ./...` in dir and returns its lines.
func goTestJSON(t *testing.T, dir string) []string {
	t.Helper()
	cmd := exec.Command("go", "test", "-json", "-count=1", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// A real `go test -json` of passing tests and an allowlisted skip: the ok
// line, the skip with its message and the rule, and a pass.
func TestAllowedSkipPasses(t *testing.T) {
	report, ok := checkStream(t, goTestJSON(t, writeModule(t, false)))
	if !ok {
		t.Fatalf("verdict: fail, want pass; report:\n%s", report)
	}
	for _, want := range []string{"ok  \texample.com/m/a\t", "SKIP example.com/m/a TestEnv: a_test.go:6: no widget here",
		"allowed (allow:2: the machine has no widget)", "1 packages passed, 0 failed; 1 tests skipped"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "quiet when passing") {
		t.Errorf("a passing test's log is printed:\n%s", report)
	}
}

// A skip that is not on the list, a failing test and a build failure
// each fail the run, and each prints what a reader needs: the skip's
// message, the failing tests' output, the compiler's error.
func TestFailuresAndUnlistedSkipsFail(t *testing.T) {
	report, ok := checkStream(t, goTestJSON(t, writeModule(t, true)))
	if ok {
		t.Fatalf("verdict: pass, want fail; report:\n%s", report)
	}
	for _, want := range []string{
		"SKIP example.com/m/a TestHollow: b_test.go:5: leader lost\n     NOT ALLOWED",
		"the failing test's log", "the subtest's error", "--- FAIL: TestFail/sub",
		"FAIL\texample.com/m/a\t",
		"not an int", // the compiler's message
		"FAIL\texample.com/m/broken",
		"1 skipped tests are not on allow", "  example.com/m/a TestHollow",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "=== RUN") {
		t.Errorf("report has go test -v framing:\n%s", report)
	}
}

// The same skip message under another test, or another message under the
// listed test, is not allowed: an entry names both.
func TestAllowNeedsTestAndMessage(t *testing.T) {
	rules, err := parseAllowlist(strings.NewReader(testAllowlist), "allow")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []skip{
		{pkg: "example.com/m/a", test: "TestOther", message: "x_test.go:1: no widget"},
		{pkg: "example.com/m/a", test: "TestEnv", message: "x_test.go:1: leader lost"},
		{pkg: "example.com/m/b", test: "TestEnv", message: "x_test.go:1: no widget"},
	} {
		if r := allow(rules, s); r != nil {
			t.Errorf("%+v allowed by line %d", s, r.line)
		}
	}
	if allow(rules, skip{pkg: "example.com/m/a", test: "TestEnv", message: "x_test.go:1: no widget"}) == nil {
		t.Error("the listed skip is not allowed")
	}
}

func TestAllowlistNeedsEveryField(t *testing.T) {
	for _, l := range []string{"pkg | ^T$ | msg", "pkg | ^T$ | msg |  ", "pkg | ( | msg | why"} {
		if _, err := parseAllowlist(strings.NewReader(l), "allow"); !errors.Is(err, errAllowlist) {
			t.Errorf("%q: %v, want errAllowlist", l, err)
		}
	}
}

// The project's own allowlist parses.
func TestProjectAllowlist(t *testing.T) {
	f, err := os.Open("../allowed-skips")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rules, err := parseAllowlist(f, "allowed-skips")
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) == 0 {
		t.Fatal("no entries")
	}
}
