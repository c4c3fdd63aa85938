package ticketing_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Another module imports the client as clients/README.md and the package
// documentation say: require ticketing v0.0.0 and replace it with a
// checkout of this repository (the module path "ticketing" cannot be
// fetched). The documentation goes on with go mod tidy, which fetches the
// modules the imported packages' own tests need; offline, this test builds
// with -mod=mod instead, which records what the build itself needs.
func TestImportFromAnotherModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds another module")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/shop\n\ngo 1.26.0\n",
		"main.go": `package main

import (
	"context"
	"errors"
	"fmt"

	ticketing "ticketing/clients/go"
	"ticketing/clients/go/fence"
)

func main() {
	_, err := ticketing.Dial(context.Background(), "/nonexistent/ticketing.sock")
	fmt.Println(errors.Is(err, ticketing.ErrNoSidecar), fence.New(fence.SQLite).Dialect)
}
`,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// Offline: the module cache that built this repository has every
		// module (tidy also wants the test imports of the imported
		// packages), verified when it was filled; the checksum database is
		// not asked again.
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOSUMDB=off", "GOFLAGS=", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// The two lines of the documentation.
	run("mod", "edit", "-require=ticketing@v0.0.0", "-replace=ticketing="+repo)
	if out := run("run", "-mod=mod", "."); strings.TrimSpace(out) != "true sqlite" {
		t.Fatalf("the other module's program printed %q", out)
	}
}
