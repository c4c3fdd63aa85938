package testkit

import (
	"strings"
	"testing"
)

// MarkdownTable returns the body rows of the first table after the line
// heading (a Markdown heading such as "## Error codes", matched whole) in
// doc, each row as its trimmed cells; the header row and the separator
// are left out. It fails t when the heading or its table is missing, so a
// document test cannot pass by finding nothing. Cells holding a literal
// "|" are not supported.
func MarkdownTable(t testing.TB, doc, heading string) [][]string {
	t.Helper()
	lines := strings.Split(doc, "\n")
	at := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == heading {
			at = i
			break
		}
	}
	if at < 0 {
		t.Fatalf("no heading %q", heading)
	}
	var rows [][]string
	for _, l := range lines[at+1:] {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "#") {
			break // the next section: the table, if any, is over
		}
		if !strings.HasPrefix(l, "|") {
			if rows != nil {
				break // the table ended
			}
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	if len(rows) < 3 || strings.Trim(strings.Join(rows[1], ""), "-: ") != "" {
		t.Fatalf("no table with a header and rows under %q", heading)
	}
	return rows[2:]
}
