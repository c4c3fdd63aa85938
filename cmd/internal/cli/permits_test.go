package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
)

// `ticketing permits set` and `ticketing lock --permit` against a real
// sidecar: set makes a semaphore of 2; two lock --permit commands hold its
// two slots at once, each sees its own token, slot and "KEY SLOT" in its
// environment; a third would be busy; a plain lock of the key is refused
// (is_semaphore, 78); set 0 while a permit is held is in_use (78), and
// once idle removes it, after which lock --permit is not_semaphore (78).
func TestPermitsSetAndLockPermit(t *testing.T) {
	sock := devSidecar(t)
	key := fmt.Sprintf("cli/permits/%d", time.Now().UnixNano())
	if code, out, errs := runMain("permits", "set", "--socket", sock, key, "2"); code != ExitOK || out != "OK\n" {
		t.Fatalf("permits set: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	ctx := context.Background()
	holder, err := ticketing.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	other, err := holder.AcquirePermit(ctx, key, 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs := runLockT("--socket", sock, "--permit", "--wait", "0", key, "--",
		"sh", "-c", `echo "$TICKETING_KEY|$TICKETING_TOKEN|$TICKETING_SLOT|$TICKETING_FENCE_KEY"`)
	if code != 0 {
		t.Fatalf("lock --permit: exit %d, stderr %q", code, errs)
	}
	f := strings.Split(strings.TrimSuffix(out, "\n"), "|")
	want := fmt.Sprintf("%s %d", key, 1-other.Slot()) // a space: no key holds one
	if len(f) != 4 || f[0] != key || f[1] == "" || f[1] == fmt.Sprint(other.Token()) || f[2] != fmt.Sprint(1-other.Slot()) || f[3] != want {
		t.Fatalf("lock --permit environment %q; want the key, a new token, slot %d and %s", out, 1-other.Slot(), want)
	}
	// Released at the end: the slot is free again, so a second one runs;
	// while it runs the semaphore is full.
	code, _, errs = runLockT("--socket", sock, "--permit", "--wait", "0", key, "--", "sh", "-c", "exit 3")
	if code != 3 {
		t.Fatalf("second lock --permit: exit %d (want the command's 3), stderr %q", code, errs)
	}
	if _, err := holder.AcquirePermit(ctx, key, 30*time.Second, 0); err != nil {
		t.Fatalf("the freed slot: %v", err)
	}
	if code, _, errs := runLockT("--socket", sock, "--permit", "--wait", "0", key, "--", "true"); code != ExitBusy {
		t.Fatalf("full semaphore: exit %d (want 75), stderr %q", code, errs)
	}
	if code, _, errs := runLockT("--socket", sock, "--wait", "0", key, "--", "true"); code != ExitLockError || !strings.Contains(errs, "is_semaphore") {
		t.Fatalf("plain lock of a semaphore: exit %d, stderr %q", code, errs)
	}
	if code, _, errs := runMain("permits", "set", "--socket", sock, key, "0"); code != ExitLockError || !strings.Contains(errs, "in_use") {
		t.Fatalf("permits set 0 in use: exit %d, stderr %q", code, errs)
	}
	holder.Close() // releases both permits
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _, errs := runMain("permits", "set", "--socket", sock, key, "0")
		if code == ExitOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("permits set 0 when idle: exit %d, stderr %q", code, errs)
		}
		time.Sleep(50 * time.Millisecond) // the session's release is asynchronous
	}
	if code, _, errs := runLockT("--socket", sock, "--permit", "--wait", "0", key, "--", "true"); code != ExitLockError || !strings.Contains(errs, "not_semaphore") {
		t.Fatalf("lock --permit of no semaphore: exit %d, stderr %q", code, errs)
	}
}
