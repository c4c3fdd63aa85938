package browser

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	ticketing "ticketing/clients/go"
	"ticketing/cmd/ticketlab/internal/labtest"
)

// devRun is a `ticketing dev` process and what it printed.
type devRun struct {
	console, secretFile, socket string
}

// startDev runs `ticketing dev` on free ports in a new directory and
// waits for its ready line.
func startDev(t *testing.T, bin string) devRun {
	t.Helper()
	dir, err := os.MkdirTemp("", "tkb") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := devRun{socket: filepath.Join(dir, "t.sock")}
	cmd := exec.Command(bin, "dev", "--base-port", "0", "--dir", filepath.Join(dir, "d"), "--socket", d.socket)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		closed := false
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if rest, ok := strings.CutPrefix(line, "console: "); ok {
				// console: URL (log in with the admin secret, FILE)
				url, rest, _ := strings.Cut(rest, " ")
				d.console = url
				d.secretFile = strings.TrimSuffix(strings.TrimPrefix(rest, "(log in with the admin secret, "), ")")
			}
			if strings.Contains(line, "ready in") && !closed {
				closed = true
				close(ready)
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatal("ticketing dev was not ready within 60 s")
	}
	if d.console == "" || d.secretFile == "" {
		t.Fatalf("ticketing dev printed no console line: %+v", d)
	}
	return d
}

// browserCtx starts headless chromium (with extra flags, if any) and
// collects the page's console errors and uncaught exceptions.
func browserCtx(t *testing.T, extra ...chromedp.ExecAllocatorOption) (context.Context, func() []string) {
	t.Helper()
	exe, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is needed for the console's browser test (make test installs it: .ci/packages)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.WindowSize(1400, 1000))
	opts = append(opts, extra...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	var mu sync.Mutex
	var errs []string
	chromedp.ListenTarget(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			errs = append(errs, "exception: "+e.ExceptionDetails.Error())
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.APITypeError || e.Type == runtime.APITypeWarning {
				var parts []string
				for _, a := range e.Args {
					parts = append(parts, string(a.Value)+a.Description)
				}
				errs = append(errs, fmt.Sprintf("console.%s: %s", e.Type, strings.Join(parts, " ")))
			}
		}
	})
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), errs...)
	}
}

// grant is a waiter's outcome: its token, or why it has none.
type grant struct {
	token uint64
	err   error
}

// revokeFromThePage revokes the holding of the key shown (token, its
// holder's label) from the page: the holder's Revoke button, the in-page
// confirmation (which shows the token and asks for a reason: none is
// refused), then the outcome, the waiter (whose token comes on next) as
// the new holder with a larger token, and the key's last revoke.
func revokeFromThePage(t *testing.T, ctx context.Context, token uint64, label, reason string, next <-chan grant) {
	t.Helper()
	button := fmt.Sprintf(`#keyview .holder[data-token="%d"] button.revoke`, token)
	var shownToken, shownHolder string
	if err := chromedp.Run(ctx,
		chromedp.Click(button, chromedp.ByQuery),
		chromedp.WaitVisible(`#revokedialog`, chromedp.ByQuery),
		chromedp.Text(`#rv-token`, &shownToken, chromedp.ByQuery),
		chromedp.Text(`#rv-holder`, &shownHolder, chromedp.ByQuery),
		// No reason, no revoke.
		chromedp.Click(`#rv-confirm`, chromedp.ByQuery),
		chromedp.WaitVisible(`#rv-error`, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("the revoke's confirmation: %v", err)
	}
	if shownToken != fmt.Sprint(token) || !strings.Contains(shownHolder, label) {
		t.Fatalf("the confirmation shows token %q, holder %q; want %d, %s", shownToken, shownHolder, token, label)
	}
	select {
	case g := <-next:
		t.Fatalf("the waiter's lock ended (%+v) before the revoke was confirmed", g)
	default:
	}
	var outcome string
	if err := chromedp.Run(ctx,
		chromedp.SendKeys(`#rv-reason`, reason, chromedp.ByQuery),
		chromedp.Click(`#rv-confirm`, chromedp.ByQuery),
		chromedp.WaitVisible(`#revokeresult[data-outcome="revoked"]`, chromedp.ByQuery),
		chromedp.WaitNotVisible(`#revokedialog`, chromedp.ByQuery),
		chromedp.Text(`#revokeresult`, &outcome, chromedp.ByQuery),
	); err != nil {
		var shown string
		_ = chromedp.Run(ctx, chromedp.Text(`#revokeresult`, &shown, chromedp.ByQuery))
		t.Fatalf("the revoke from the page: %v (the page says %q)", err, shown)
	}
	var nextToken uint64
	select {
	case g := <-next:
		if g.err != nil {
			t.Fatalf("the waiter after the revoke: %v", g.err)
		}
		nextToken = g.token
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter did not get the key after the revoke")
	}
	if nextToken <= token {
		t.Fatalf("the waiter's token %d after the revoke of %d", nextToken, token)
	}
	if !strings.Contains(outcome, fmt.Sprintf("Revoked token %d", token)) || !strings.Contains(outcome, fmt.Sprintf("token %d", nextToken)) {
		t.Fatalf("the outcome %q does not name the revoked token %d and the next %d", outcome, token, nextToken)
	}
	var last string
	if err := chromedp.Run(ctx,
		chromedp.WaitVisible(fmt.Sprintf(`#keyview .holder[data-token="%d"]`, nextToken), chromedp.ByQuery),
		chromedp.WaitVisible(fmt.Sprintf(`#keyview #lastrevoke[data-token="%d"]`, token), chromedp.ByQuery),
		chromedp.Text(`#keyview #lastrevoke`, &last, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("the key after the revoke: %v", err)
	}
	if !strings.Contains(last, "by console:") || !strings.Contains(last, reason) {
		t.Fatalf("the key's last revoke %q does not say who and why", last)
	}
	// Tokens are u64: the page keeps those past 2^53 digit for digit (a
	// rounded one shown, or sent back to revoke, could name another
	// holding), and digits inside strings stay as they are.
	var exact bool
	if err := chromedp.Run(ctx, chromedp.Evaluate(`(() => {
		const v = parseJSON('{"token": 18446744073709551615, "next": [9007199254740993], "at_unix_ms": 1765000000000, "reason": "x:12345678901234567,"}');
		return v.token === "18446744073709551615" && v.next[0] === "9007199254740993" && v.at_unix_ms === 1765000000000 && v.reason === "x:12345678901234567,";
	})()`, &exact)); err != nil || !exact {
		t.Fatalf("the page's parseJSON does not keep large tokens exact: %v", err)
	}
	t.Logf("revoked from the page: %q; last revoke: %q", outcome, last)
}

// The console in a real browser, against a real `ticketing dev`: the login
// with the admin secret, the live stream, a lock taken through the sidecar
// showing up as the hottest line, the key's holder and its waiter's place
// in line, then a revoke from the page (confirmed with a reason) that
// hands the key to the waiter with a larger token; no console error or
// exception on the page all along. With
// TICKETING_CONSOLE_SCREENSHOT set, the page is saved there as a PNG
// (docs/operations.md's screenshot: `make console-screenshot`).
func TestConsoleInARealBrowser(t *testing.T) {
	bin, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	d := startDev(t, bin)
	secret, err := os.ReadFile(d.secretFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, pageErrors := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	// The login: the page sends an unauthenticated browser to the form.
	var loc string
	if err := chromedp.Run(ctx,
		chromedp.Navigate(d.console),
		chromedp.WaitVisible(`input[name="secret"]`, chromedp.ByQuery),
		chromedp.Location(&loc),
	); err != nil {
		t.Fatalf("the login form: %v", err)
	}
	if !strings.HasSuffix(loc, "/login") {
		t.Fatalf("an unauthenticated browser landed on %s, want the login", loc)
	}
	if err := chromedp.Run(ctx,
		chromedp.SendKeys(`input[name="secret"]`, strings.TrimSpace(string(secret)), chromedp.ByQuery),
		chromedp.Submit(`input[name="secret"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#conn.live`, chromedp.ByQuery),
		chromedp.WaitVisible(`#members tbody tr`, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("logging in and the live stream: %v", err)
	}

	// A lock through the sidecar, and a waiter behind it.
	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	holder, err := ticketing.Dial(cctx, d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	waiter, err := ticketing.Dial(cctx, d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	taken := time.Now()
	lk, err := holder.Lock(cctx, "seats/A1", 120*time.Second, 0, ticketing.WithLabel("order-1001"))
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan struct{})
	next := make(chan grant, 1) // the waiter's, once it holds the key
	go func() {
		l, err := waiter.Lock(cctx, "seats/A1", 30*time.Second, 60*time.Second, ticketing.WithLabel("order-1002"),
			ticketing.WithQueued(func() { close(queued) }))
		if err != nil {
			next <- grant{err: err}
			return
		}
		next <- grant{token: l.Token()}
	}()
	select {
	case <-queued:
	case <-cctx.Done():
		t.Fatal("the waiter was never queued")
	}
	row := `#lines tbody tr[data-key="seats/A1"]`
	if err := chromedp.Run(ctx, chromedp.WaitVisible(row, chromedp.ByQuery)); err != nil {
		t.Fatalf("the hottest line never showed seats/A1: %v", err)
	}
	shown := time.Since(taken)
	var rowText string
	if err := chromedp.Run(ctx, chromedp.Text(row, &rowText, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rowText, "order-1001") {
		t.Fatalf("the line's row %q does not name its holder's label", rowText)
	}
	t.Logf("a lock taken through the sidecar showed on the page after %v: %q", shown.Round(time.Millisecond), rowText)

	// The key: its holder with its token, and the waiter in place 1.
	holderSel := fmt.Sprintf(`#keyview .holder[data-token="%d"]`, lk.Token())
	placeSel := `#keyview #queue tr[data-position="1"]`
	var holderText, placeText string
	if err := chromedp.Run(ctx,
		chromedp.Click(row, chromedp.ByQuery),
		chromedp.WaitVisible(holderSel, chromedp.ByQuery),
		chromedp.WaitVisible(placeSel, chromedp.ByQuery),
		chromedp.Text(holderSel, &holderText, chromedp.ByQuery),
		chromedp.Text(placeSel, &placeText, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("the key's view: %v", err)
	}
	if !strings.Contains(holderText, "order-1001") || !strings.Contains(placeText, "order-1002") {
		t.Fatalf("the key's view: holder %q, place 1 %q", holderText, placeText)
	}
	// A second waiter, still in line after the revoke (the screenshot
	// shows a line).
	third, err := ticketing.Dial(cctx, d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	queued3 := make(chan struct{})
	go func() {
		_, _ = third.Lock(cctx, "seats/A1", 30*time.Second, 60*time.Second, ticketing.WithLabel("order-1003"),
			ticketing.WithQueued(func() { close(queued3) }))
	}()
	select {
	case <-queued3:
	case <-cctx.Done():
		t.Fatal("the second waiter was never queued")
	}
	revokeFromThePage(t, ctx, lk.Token(), "order-1001", "order-1001 never paid, ticket OPS-17", next)
	if err := chromedp.Run(ctx, chromedp.WaitVisible(`#keyview #queue tr[data-position="1"][data-owner]`, chromedp.ByQuery),
		chromedp.Text(placeSel, &placeText, chromedp.ByQuery)); err != nil || !strings.Contains(placeText, "order-1003") {
		t.Fatalf("after the revoke, place 1 is %q (%v), want order-1003", placeText, err)
	}
	// Some traffic for the charts (and the screenshot): clients cycling
	// acquire → release on a few keys of their own while samples come.
	busy, stopBusy := context.WithCancel(cctx)
	var wg sync.WaitGroup
	for i := range 6 {
		c, err := ticketing.Dial(cctx, d.socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("seats/B%d", 1+i%3)
			for busy.Err() == nil {
				if tok, err := c.Acquire(busy, key, 10*time.Second, 5*time.Second); err == nil {
					time.Sleep(20 * time.Millisecond)
					_ = c.Release(cctx, key, tok)
				}
			}
		}()
	}
	time.Sleep(6 * time.Second)
	stopBusy()
	wg.Wait()
	if path := os.Getenv("TICKETING_CONSOLE_SCREENSHOT"); path != "" {
		var png []byte
		if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
	if errs := pageErrors(); len(errs) > 0 {
		t.Fatalf("the page logged errors:\n%s", strings.Join(errs, "\n"))
	}
	_ = lk.Release(cctx)
}
