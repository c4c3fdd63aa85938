package ticketing_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
)

// Dial with no sidecar says so, naming the socket and what to start: for a
// path with no socket file, and for a stale socket file that nothing serves.
func TestDialNoSidecar(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false) // leave the file, as a killed sidecar does
	ln.Close()
	for _, tc := range []struct{ path, why string }{
		{filepath.Join(dir, "missing.sock"), "no socket file there"},
		{stale, "nothing serves that socket file"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := ticketing.Dial(ctx, tc.path)
		cancel()
		if err == nil {
			c.Close()
			t.Fatalf("Dial(%s) succeeded", tc.path)
		}
		if !errors.Is(err, ticketing.ErrNoSidecar) {
			t.Errorf("Dial(%s): %v, want ErrNoSidecar", tc.path, err)
		}
		for _, want := range []string{tc.path, tc.why, "ticketing dev", "ticketing sidecar"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Dial(%s): %q does not say %q", tc.path, err, want)
			}
		}
	}
}
