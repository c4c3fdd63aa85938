package cli

import (
	"bytes"
	"strings"
	"testing"

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
