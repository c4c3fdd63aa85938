package unixapi

import (
	"cmp"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"ticketing/cluster/testkit"
)

// PROTOCOL.md's "Errors" table is errorTable (errors.go): the same pairs
// of reply (a code, or a whole-line word such as BUSY) and Go sentinel,
// and an "internal" row for everything else. The sentinels' names are
// read from errors.go's source, so a row added, dropped or moved to
// another code on one side only fails here.
func TestProtocolErrorTableMatchesCode(t *testing.T) {
	type pair struct{ reply, sentinel string }
	var inCode []pair
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "errorTable" {
			return true
		}
		for _, e := range vs.Values[0].(*ast.CompositeLit).Elts {
			fields := e.(*ast.CompositeLit).Elts
			if len(fields) != 3 {
				t.Fatalf("errorTable entry at %v: want {err, reply, code}", fset.Position(e.Pos()))
			}
			sentinel := exprString(fields[0])
			if !strings.Contains(sentinel, ".") {
				sentinel = "unixapi." + sentinel
			}
			reply, _ := strconv.Unquote(fields[1].(*ast.BasicLit).Value)
			code, _ := strconv.Unquote(fields[2].(*ast.BasicLit).Value)
			if reply == "" {
				reply = code
			}
			inCode = append(inCode, pair{reply, sentinel})
		}
		return false
	})
	if len(inCode) != len(errorTable) {
		t.Fatalf("read %d entries of errorTable from errors.go, it has %d", len(inCode), len(errorTable))
	}
	for i, e := range errorTable {
		if want := cmp.Or(e.reply, e.code); inCode[i].reply != want {
			t.Fatalf("errorTable[%d] read as %q, is %q", i, inCode[i].reply, want)
		}
	}

	b, err := os.ReadFile("PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	var inDoc []pair
	internal := false
	for _, row := range testkit.MarkdownTable(t, string(b), "## Errors") {
		if len(row) != 3 {
			t.Fatalf("error row %q: want | code | sentinels | when |", row)
		}
		reply := strings.Trim(strings.TrimPrefix(row[0], "— "), "`")
		if reply == "internal" {
			internal = row[1] == "anything else"
			continue
		}
		for _, s := range strings.Split(row[1], ",") {
			inDoc = append(inDoc, pair{reply, strings.Trim(strings.TrimSpace(s), "`")})
		}
	}
	if !internal {
		t.Error(`PROTOCOL.md has no "internal | anything else" row`)
	}
	for _, p := range inCode {
		if !slices.Contains(inDoc, p) {
			t.Errorf("errors.go answers %s with %s; PROTOCOL.md does not say so", p.sentinel, p.reply)
		}
	}
	for _, p := range inDoc {
		if !slices.Contains(inCode, p) {
			t.Errorf("PROTOCOL.md answers %s with %s; errors.go does not", p.sentinel, p.reply)
		}
	}
}

// exprString renders a sentinel expression of errorTable: an identifier
// or pkg.Name.
func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	}
	return "?"
}
