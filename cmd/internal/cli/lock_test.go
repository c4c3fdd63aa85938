package cli

import (
	"slices"
	"strings"
	"testing"
)

// lock's arguments: one key with or without the --, as always; several
// keys end at the first --, and the command's own -- stays its own.
func TestLockArgs(t *testing.T) {
	for _, tc := range []struct {
		args, keys, argv string
	}{
		{"k -- cmd a", "k", "cmd a"},
		{"k cmd a", "k", "cmd a"},
		{"k -- git diff -- f", "k", "git diff -- f"},
		{"k --", "k", ""},
		{"k", "k", ""},
		{"k1 k2 k3 -- cmd a", "k1 k2 k3", "cmd a"},
		{"k1 k2 -- git diff -- f", "k1 k2", "git diff -- f"},
		{"k1 k2 --", "k1 k2", ""},
		{"", "", ""},
	} {
		keys, argv := lockArgs(strings.Fields(tc.args))
		if !slices.Equal(keys, strings.Fields(tc.keys)) || !slices.Equal(argv, strings.Fields(tc.argv)) {
			t.Errorf("lockArgs(%q) = %q, %q; want %q, %q", tc.args, keys, argv, tc.keys, tc.argv)
		}
	}
}

// Bad block arguments are refused before the socket is tried, with the
// reason and the usage.
func TestLockBlockArguments(t *testing.T) {
	many := strings.Fields("a b c d e f g h i j k l m n o p q")
	for _, tc := range []struct {
		args []string
		why  string
	}{
		{[]string{"lock", "k1", "k2", "--"}, `ticketing lock: want a COMMAND to run after the KEYs ["k1" "k2"]`},
		{[]string{"lock", "k1", "k1", "--", "true"}, `ticketing lock: KEY "k1" named twice`},
		{append(append([]string{"lock"}, many...), "--", "true"), "ticketing lock: 17 KEYs: a block has at most 16"},
		{[]string{"acquire", "k1", "k2", "k1"}, `ticketing acquire: KEY "k1" named twice`},
		{append([]string{"acquire"}, many...), "ticketing acquire: want one KEY (or up to 16, a block), got 17 arguments"},
	} {
		code, out, errs := runMain(tc.args...)
		if code != ExitLockError || out != "" || !strings.HasPrefix(errs, tc.why) || !strings.Contains(errs, "\nusage: ") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 78 and %q, then the usage", tc.args, code, out, errs, tc.why)
		}
	}
}
