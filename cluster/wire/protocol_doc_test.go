package wire

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"ticketing/cluster/testkit"
)

// PROTOCOL.md's error tables are the code's: "Error codes" lists every
// Code with its number and name (codes.go) in order, and "Admin error
// codes" every admin reply code (admin.go) in AdminCodes' order. A code
// added, renamed or renumbered on one side only fails here.
func TestProtocolErrorTablesMatchCode(t *testing.T) {
	b, err := os.ReadFile("PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)

	documented := map[Code]string{}
	last := Code(0)
	for _, row := range testkit.MarkdownTable(t, doc, "## Error codes") {
		n, err := strconv.Atoi(row[0])
		if err != nil || len(row) < 3 {
			t.Fatalf("error code row %q: want | number | `name` | meaning ...", row)
		}
		c := Code(n)
		if c <= last {
			t.Errorf("code %d listed after %d: the table is in code order", c, last)
		}
		last = c
		documented[c] = strings.Trim(row[1], "`")
	}
	for c, name := range codeNames {
		if got, ok := documented[c]; !ok {
			t.Errorf("code %d %s is not in PROTOCOL.md's error table", c, name)
		} else if got != name {
			t.Errorf("code %d is %q in PROTOCOL.md, %q in codes.go", c, got, name)
		}
	}
	for c, name := range documented {
		if _, ok := codeNames[c]; !ok {
			t.Errorf("PROTOCOL.md lists code %d %q, which codes.go does not have", c, name)
		}
	}

	var admin []string
	for _, row := range testkit.MarkdownTable(t, doc, "### Admin error codes") {
		admin = append(admin, strings.Trim(row[0], "`"))
	}
	if !slices.Equal(admin, AdminCodes) {
		t.Errorf("PROTOCOL.md's admin error codes %q, admin.go's AdminCodes %q", admin, AdminCodes)
	}
}
