package cluster

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The defaults are written once: withDefaults fills a zero Config with
// exactly DefaultConfig's tunables and leaves the ones set alone, and
// every field whose comment promises a default ("Zero: Default...") has a
// nonzero one in DefaultConfig.
func TestDefaultsWrittenOnce(t *testing.T) {
	got := Config{}.withDefaults()
	if got.Logger == nil || got.Now == nil {
		t.Fatal("withDefaults left Logger or Now nil")
	}
	got.Logger, got.Now = nil, nil
	if !reflect.DeepEqual(got, DefaultConfig()) {
		t.Errorf("Config{}.withDefaults() = %+v,\nwant DefaultConfig() = %+v", got, DefaultConfig())
	}
	set := Config{NodeID: "n1", IdleTimeout: 3 * time.Second, AuthFailureDelay: 10 * time.Second}.withDefaults()
	if set.NodeID != "n1" || set.IdleTimeout != 3*time.Second || set.AuthFailureDelayMax != 10*time.Second ||
		set.MaxKeys != DefaultMaxKeys {
		t.Errorf("withDefaults of a partly set config: %+v", set)
	}

	f, err := parser.ParseFile(token.NewFileSet(), "config.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	d := reflect.ValueOf(DefaultConfig())
	promised := 0
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Config" {
			return true
		}
		doc := ""
		for _, field := range ts.Type.(*ast.StructType).Fields.List {
			// A field without a comment of its own shares the one above it
			// (SnapshotThreshold, SnapshotInterval, TrailingLogs).
			if field.Doc != nil {
				doc = strings.Join(strings.Fields(field.Doc.Text()), " ")
			}
			if !strings.Contains(doc, "Zero: Default") {
				continue
			}
			for _, name := range field.Names {
				promised++
				if d.FieldByName(name.Name).IsZero() {
					t.Errorf("Config.%s promises a default, DefaultConfig has none", name.Name)
				}
			}
		}
		return false
	})
	if want := 26; promised != want {
		t.Errorf("%d fields of Config promise a default, want %d (update this count with a new tunable)", promised, want)
	}
}
