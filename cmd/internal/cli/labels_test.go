package cli

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/wire"
)

// inspect shows a holder's label on its own line and, when a waiter has
// one, a LABEL column ("-" for waiters without); a key without labels
// prints exactly as before (no Label line, no column).
func TestPrintKeyLabels(t *testing.T) {
	k := &wire.KeyReport{Key: "k", ServerID: "n1/1", Role: "leader", Held: true, QueueLen: 2,
		Holder: &wire.HolderReport{Owner: "h/1.1", Token: 7, LeaseSec: 30, Label: "nightly-backup"},
		Queue:  []wire.WaiterReport{{Owner: "w/1.2", LeaseSec: 30, Label: "req/42"}, {Owner: "w/1.3", LeaseSec: 30}}}
	var b bytes.Buffer
	printKey(&errWriter{w: &b}, k)
	out := b.String()
	if !strings.Contains(out, "Label:        nightly-backup\n") || !strings.Contains(out, "LABEL") ||
		!strings.Contains(out, "req/42") || !strings.Contains(out, "w/1.3  -") {
		t.Fatalf("with labels:\n%s", out)
	}
	k.Holder.Label, k.Queue[0].Label = "", ""
	b.Reset()
	printKey(&errWriter{w: &b}, k)
	if out := b.String(); strings.Contains(out, "Label") || strings.Contains(out, "LABEL") {
		t.Fatalf("without labels:\n%s", out)
	}
}

// lock and acquire take --label: the acquire carries it through the
// sidecar to the cluster (granted: the cluster speaks labels), and a bad
// one is refused before anything is sent.
func TestLockAndAcquireLabel(t *testing.T) {
	sock := devSidecar(t)
	key := fmt.Sprintf("label/%d", time.Now().UnixNano())
	if code, out, errs := runLockT("--socket", sock, "--label", "nightly-backup", "--wait", "0", key, "--", "sh", "-c", "echo ran"); code != 0 || out != "ran\n" {
		t.Fatalf("lock --label: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	var out, errb syncBuffer
	if code := runAcquire(context.Background(), []string{"--socket", sock, "--label", "req/42", "--wait", "0", key}, &out, &errb); code != 0 || out.String() == "" {
		t.Fatalf("acquire --label: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	for _, bad := range []string{"a b", "-", strings.Repeat("l", ticketing.MaxLabelLen+1)} {
		code, _, errs := runLockT("--socket", sock, "--label", bad, key, "--", "true")
		if code == 0 || !strings.Contains(errs, "--label") {
			t.Fatalf("lock --label %q: exit %d, stderr %q", bad, code, errs)
		}
	}
}
