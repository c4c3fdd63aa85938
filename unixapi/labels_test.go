package unixapi_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"ticketing/locksm"
	"ticketing/unixapi"
)

// Owner labels over the socket (version 5), through a real sidecar broker
// and a real cluster: ACQUIRE ... label=<label> is granted, HELD lists the
// label after each key:token ("-" for none), the cluster's inspect shows
// it on the holder, and the lock's expiry comes as
// `! LOST <token> expired <label> <key>`. The log names the label where it
// records the grant and the loss.
func TestLabelsOverTheSocket(t *testing.T) {
	var logs syncBuf
	s := serve(t, func(cfg *unixapi.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	k, k2 := key(t), key(t)
	a := dial(t, s)
	expect(t, a.do("HELLO 5 events"), "HELLO 5 events")
	tok := token(t, a.do("ACQUIRE "+k+" 1 0 label=job-1"))
	tok2 := token(t, a.do("ACQUIRE "+k2+" 30 0"))
	want := fmt.Sprintf("HELD 2 %s:%d job-1 %s:%d -", k, tok, k2, tok2)
	if k2 < k {
		want = fmt.Sprintf("HELD 2 %s:%d - %s:%d job-1", k2, tok2, k, tok)
	}
	expect(t, a.do("HELD"), want)
	kr, err := testCluster.Node(0).Inspect(k)
	for i := 1; err == nil && (kr.Holder == nil || kr.Holder.Token != tok) && i < 50; i++ {
		time.Sleep(20 * time.Millisecond) // node 0 may be a follower still applying
		kr, err = testCluster.Node(0).Inspect(k)
	}
	if err != nil || kr.Holder == nil || kr.Holder.Label != "job-1" {
		t.Fatalf("inspect %s: %v %+v", k, err, kr.Holder)
	}
	line := a.read() // the 1 s lease runs out
	ev, err := unixapi.ParseEventVersion([]byte(line), unixapi.VersionLabels)
	if err != nil || ev.Name != unixapi.EventLost || ev.Token != tok || ev.Reason != "expired" || ev.Label != "job-1" ||
		strings.Join(ev.Keys, " ") != k || line != fmt.Sprintf("! LOST %d expired job-1 %s", tok, k) {
		t.Fatalf("lost event %q: %+v %v", line, ev, err)
	}
	expect(t, a.do("HELD"), fmt.Sprintf("HELD 1 %s:%d -", k2, tok2))
	for msg, want := range map[string]string{
		`msg="lock granted"`: fmt.Sprintf(`key=%s token=%d label=job-1`, k, tok),
		`msg="lock lost"`:    fmt.Sprintf(`key=%s token=%d label=job-1 why=expired`, k, tok),
	} {
		found := false
		for _, line := range strings.Split(logs.String(), "\n") {
			found = found || strings.Contains(line, msg) && strings.Contains(line, want)
		}
		if !found {
			t.Errorf("the log has no %s with %q:\n%s", msg, want, logs.String())
		}
	}
	if strings.Contains(logs.String(), `label=""`) {
		t.Errorf("an unlabelled lock logged an empty label:\n%s", logs.String())
	}
}

// syncBuf is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A block carries one label; a key may start with "label=" and stays a
// key (only the field after the wait is a label); bad labels are refused
// invalid_label, nothing sent.
func TestLabelsBlocksAndRefusals(t *testing.T) {
	s := serve(t, nil)
	a := dial(t, s)
	expect(t, a.do("HELLO 5"), "HELLO 5")
	k1, k2 := key(t), key(t)
	tb := token(t, a.do("ACQUIRE "+k1+" "+k2+" 30 0 label=seats"))
	expect(t, a.do("HELD"), fmt.Sprintf("HELD 2 %s:%d seats %s:%d seats", k1, tb, k2, tb))
	lk := "label=" + key(t)
	tl := token(t, a.do("ACQUIRE "+lk+" 30 0"))
	expect(t, a.do("RELEASE "+lk+" "+fmt.Sprint(tl)), "OK")
	for _, bad := range []string{"label=", "label=-", "label=" + strings.Repeat("l", locksm.MaxLabelLen+1), "label=a\x01b"} {
		expectPrefix(t, a.do("ACQUIRE "+key(t)+" 30 0 "+bad), "ERR invalid_label ")
	}
	expect(t, a.do("HELD"), fmt.Sprintf("HELD 2 %s:%d seats %s:%d seats", k1, tb, k2, tb))
}

// A connection that did not agree version 5 sees exactly what version 4
// wrote: a label= field is read as the wait and the fields before it
// shift (here the wait 0 becomes the lease: invalid_lease), HELD has no
// labels, and LOST names no label, even for a lock a version 5 HELLO
// labelled before a later HELLO 4.
func TestLabelsOlderConnections(t *testing.T) {
	s := serve(t, nil)
	a := dial(t, s)
	k := key(t)
	expectPrefix(t, a.do("ACQUIRE "+k+" 30 0 label=job"), "ERR invalid_lease ")
	expect(t, a.do("HELLO 4 events"), "HELLO 4 events")
	expectPrefix(t, a.do("ACQUIRE "+k+" 30 0 label=job"), "ERR invalid_lease ")
	expect(t, a.do("HELLO 5 events"), "HELLO 5 events")
	tok := token(t, a.do("ACQUIRE "+k+" 1 0 label=job"))
	expect(t, a.do("HELLO 4 events"), "HELLO 4 events")
	expect(t, a.do("HELD"), fmt.Sprintf("HELD 1 %s:%d", k, tok))
	a.event(tok, "expired", k)
}

// The parser: the label is the last field of an ACQUIRE, from version 5.
func TestParseLabel(t *testing.T) {
	r, err := unixapi.ParseLineVersion([]byte("ACQUIRE a b 30 1.5 label=x:y/z"), unixapi.VersionLabels)
	if err != nil || r.Label != "x:y/z" || strings.Join(r.Keys, ",") != "a,b" || r.Wait != 1500*time.Millisecond {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = unixapi.ParseLineVersion([]byte("ACQUIRE label=k 30 0"), unixapi.VersionLabels)
	if err != nil || r.Key != "label=k" || r.Label != "" {
		t.Fatalf("a key starting with label=: %+v %v", r, err)
	}
	if _, err := unixapi.ParseLineVersion([]byte("ACQUIRE label=k"), unixapi.VersionLabels); !errors.Is(err, unixapi.ErrBadRequest) {
		t.Fatalf("no key, lease or wait: %v", err)
	}
	if _, err := unixapi.ParseLine([]byte("ACQUIRE k 30 0 label=x")); !errors.Is(err, locksm.ErrInvalidLease) {
		t.Fatalf("version 4: %v", err)
	}
	for _, l := range []string{"ACQUIRE k 30 0 label=", "ACQUIRE k 30 0 label=-", "ACQUIRE k 30 0 label=a\x7fb"} {
		if _, err := unixapi.ParseLineVersion([]byte(l), unixapi.VersionLabels); !errors.Is(err, locksm.ErrInvalidLabel) {
			t.Errorf("%q: %v", l, err)
		}
	}
	ev, err := unixapi.ParseEventVersion([]byte("! LOST 7 moved - a b"), unixapi.VersionLabels)
	if err != nil || ev.Label != "" || strings.Join(ev.Keys, " ") != "a b" {
		t.Fatalf("%+v %v", ev, err)
	}
	if got := unixapi.FormatLostLabel(7, "moved", "", []string{"a", "b"}); got != "! LOST 7 moved - a b" {
		t.Fatal(got)
	}
}

// The LOST lines written as the sidecar shuts down (compensated) follow the
// connection's version like every other: from version 5 they carry the
// label ("-" for none), so that a client does not read the first key as
// the label.
func TestShutdownLostCarriesLabel(t *testing.T) {
	s := serve(t, nil)
	k1, k2 := key(t), key(t)
	a := dial(t, s)
	expect(t, a.do("HELLO 5 events"), "HELLO 5 events")
	t1 := token(t, a.do("ACQUIRE "+k1+" 30 0 label=job-1"))
	t2 := token(t, a.do("ACQUIRE "+k2+" 30 0"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for range 2 {
		got[a.read()] = true
	}
	for _, want := range []string{fmt.Sprintf("! LOST %d compensated job-1 %s", t1, k1), fmt.Sprintf("! LOST %d compensated - %s", t2, k2)} {
		if !got[want] {
			t.Errorf("shutdown events %v, missing %q", got, want)
		}
	}
}
