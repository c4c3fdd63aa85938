// Package scripttest runs data-driven test scripts in the style of
// etcd-io/raft's interaction tests (github.com/cockroachdb/datadriven),
// written here to keep the module free of test-only dependencies. locksm
// and cluster/leader pin their rules with it; nothing in the product
// binary imports it.
//
// A script (testdata/*.txt) is a sequence of cases:
//
//	# comments and blank lines before a case are kept on rewrite
//	acquire key=k owner=a lease=10
//	----
//	granted token=1
//
// The expected output runs from the "----" line to the next blank line
// (or the end of the file), so outputs never contain blank lines. A
// command is a name and key=value arguments (ParseCommand); what it means
// and prints is the caller's.
package scripttest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Case is one command of a script and the output it is expected to print.
type Case struct {
	Path   string   // the script's file
	Pre    []string // comment and blank lines before the command
	Line   int      // 1-based line of the command
	Cmd    string
	Expect string
}

// Where is PATH:LINE of the case, for messages.
func (c Case) Where() string { return fmt.Sprintf("%s:%d", c.Path, c.Line) }

// ErrSyntax wraps every malformed script or command line.
var ErrSyntax = errors.New("scripttest: syntax")

// Parse reads a script: its cases, and the comment lines after the last.
func Parse(path string) (cases []Case, tail []string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var pre []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pre = append(pre, l)
			continue
		}
		c := Case{Path: path, Pre: pre, Line: i + 1, Cmd: l}
		pre = nil
		if i+1 >= len(lines) || lines[i+1] != "----" {
			return nil, nil, fmt.Errorf("%w: %s: command not followed by ----", ErrSyntax, c.Where())
		}
		i += 2
		var out []string
		for ; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
			out = append(out, lines[i])
		}
		c.Expect = strings.Join(out, "\n")
		cases = append(cases, c)
	}
	return cases, pre, nil
}

// Files lists dir/*.txt, failing t when there is none.
func Files(t testing.TB, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no scripts in %s", dir)
	}
	return files
}

// Name is the subtest name of a script: its file name without .txt.
func Name(path string) string { return strings.TrimSuffix(filepath.Base(path), ".txt") }

// Run runs the script at path: step runs each case and returns what it
// printed (trailing newlines are dropped), which must equal the case's
// expected output. With rewrite, the expected
// outputs are replaced by what was printed and the file is written back
// (review the diff).
func Run(t *testing.T, path string, rewrite bool, step func(t *testing.T, c Case) string) {
	t.Helper()
	cases, tail, err := Parse(path)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for _, c := range cases {
		got := strings.TrimRight(step(t, c), "\n")
		if rewrite {
			for _, l := range c.Pre {
				out.WriteString(l + "\n")
			}
			// The blank line ends the output block; the parser consumed it.
			fmt.Fprintf(&out, "%s\n----\n%s\n\n", c.Cmd, got)
			continue
		}
		if got != c.Expect {
			t.Errorf("%s: %s\ngot:\n%s\nwant:\n%s", c.Where(), c.Cmd, got, c.Expect)
		}
	}
	if rewrite {
		for _, l := range tail {
			out.WriteString(l + "\n")
		}
		data := append(bytes.TrimRight(out.Bytes(), "\n"), '\n')
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// ParseCommand splits a command line into its name and key=value
// arguments. Values are bare words, or Go-quoted strings optionally
// repeated: key="x"*256 is 256 x's. An argument given twice is an error.
func ParseCommand(line string) (string, map[string]string, error) {
	line = strings.TrimSpace(line)
	name, rest, _ := strings.Cut(line, " ")
	args := map[string]string{}
	for rest = strings.TrimLeft(rest, " "); rest != ""; rest = strings.TrimLeft(rest, " ") {
		k, r, ok := strings.Cut(rest, "=")
		if !ok || k == "" || strings.Contains(k, " ") {
			return "", nil, fmt.Errorf("%w: bad argument at %q", ErrSyntax, rest)
		}
		var v string
		if strings.HasPrefix(r, `"`) {
			q, err := strconv.QuotedPrefix(r)
			if err != nil {
				return "", nil, fmt.Errorf("%w: %s: %v", ErrSyntax, k, err)
			}
			v, _ = strconv.Unquote(q)
			r = r[len(q):]
			if strings.HasPrefix(r, "*") {
				end := strings.IndexByte(r, ' ')
				if end < 0 {
					end = len(r)
				}
				n, err := strconv.Atoi(r[1:end])
				if err != nil {
					return "", nil, fmt.Errorf("%w: %s: bad repeat: %v", ErrSyntax, k, err)
				}
				v = strings.Repeat(v, n)
				r = r[end:]
			}
		} else {
			end := strings.IndexByte(r, ' ')
			if end < 0 {
				end = len(r)
			}
			v, r = r[:end], r[end:]
		}
		if _, dup := args[k]; dup {
			return "", nil, fmt.Errorf("%w: argument %s twice", ErrSyntax, k)
		}
		args[k] = v
		rest = r
	}
	return name, args, nil
}
