package scripttest

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestParseCommand(t *testing.T) {
	name, args, err := ParseCommand(`acquire key="a b"*2 owner=x ref=3`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"key": "a ba b", "owner": "x", "ref": "3"}
	if name != "acquire" || !reflect.DeepEqual(args, want) {
		t.Fatalf("got %q %v", name, args)
	}
	for _, bad := range []string{`acquire key`, `acquire key=a key=b`, `acquire key="unterminated`, `acquire key="x"*many`} {
		if _, _, err := ParseCommand(bad); !errors.Is(err, ErrSyntax) {
			t.Errorf("%s: %v, want ErrSyntax", bad, err)
		}
	}
}

// Run compares each case's output, and with rewrite writes the outputs
// back keeping the comments.
func TestRunAndRewrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.txt")
	script := "# a comment\necho a=1\n----\nstale\n\n# between\necho a=2\n----\na=2\n\n# tail\n"
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	echo := func(t *testing.T, c Case) string {
		_, args, err := ParseCommand(c.Cmd)
		if err != nil {
			t.Fatal(err)
		}
		return "a=" + args["a"] + "\n"
	}
	cases, _, err := Parse(path)
	if err != nil || len(cases) != 2 || cases[0].Expect != "stale" || cases[0].Line != 2 || len(cases[1].Pre) != 1 || cases[1].Pre[0] != "# between" {
		t.Fatalf("parsed %+v, %v", cases, err)
	}
	Run(t, path, true, echo)
	got, _ := os.ReadFile(path)
	want := "# a comment\necho a=1\n----\na=1\n\n# between\necho a=2\n----\na=2\n\n# tail\n"
	if string(got) != want {
		t.Fatalf("rewritten:\n%s\nwant:\n%s", got, want)
	}
	Run(t, path, false, echo)
	if _, _, err := Parse(filepath.Join(t.TempDir(), "missing.txt")); err == nil {
		t.Fatal("a missing script parsed")
	}
	bad := filepath.Join(t.TempDir(), "bad.txt")
	if err := os.WriteFile(bad, []byte("echo a=1\nno separator\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Parse(bad); !errors.Is(err, ErrSyntax) {
		t.Fatalf("a command without ---- parsed: %v", err)
	}
}
