package wire

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"ticketing/locksm"
)

// A label (version 8) rides at the end of 'a' and 'b'; without one the
// frame is byte for byte what versions 2–7 read, and a version 8 decoder
// reads old frames as label-less.
func TestAcquireLabel(t *testing.T) {
	plain := Msg{Type: TypeAcquire, ID: 1, Key: "k", Owner: "o", Lease: 10, WaitMs: 5}
	old, err := AppendMsg(nil, &plain)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0, 0, 0, 1 + 8 + 2 + 4 + 2 + 2, TypeAcquire, 0, 0, 0, 0, 0, 0, 0, 1, 0, 10, 0, 0, 0, 5, 1, 'k', 1, 'o'}
	if !bytes.Equal(old, want) {
		t.Fatalf("unlabelled acquire: % x, want % x", old, want)
	}
	for _, m := range []Msg{
		{Type: TypeAcquire, ID: 1, Key: "k", Owner: "o", Lease: 10, Label: "job-1"},
		{Type: TypeAcquireBlock, ID: 2, Keys: []string{"a", "b"}, Owner: "o", Lease: 10, Label: strings.Repeat("l", locksm.MaxLabelLen)},
		{Type: TypeAcquireBlock, ID: 3, Keys: []string{"a", "b"}, Owner: "o", Lease: 10},
	} {
		b, err := AppendMsg(nil, &m)
		if err != nil {
			t.Fatalf("%+v: %v", m, err)
		}
		var got Msg
		if err := DecodeMsg(b[4], b[5:], &got); err != nil || got.Label != m.Label {
			t.Fatalf("%+v: decoded %+v, %v", m, got, err)
		}
	}
	// An empty label sent as a field has another canonical form (none):
	// malformed. A label over 64 bytes is a field error, answered
	// invalid_label under the request's id.
	empty := append(bytes.Clone(old[5:]), 0)
	var m Msg
	if err := DecodeMsg(TypeAcquire, empty, &m); !errors.Is(err, ErrMalformed) || IsFieldError(err) {
		t.Errorf("empty label: %v", err)
	}
	long := append(append(bytes.Clone(old[5:]), locksm.MaxLabelLen+1), strings.Repeat("l", locksm.MaxLabelLen+1)...)
	err = DecodeMsg(TypeAcquire, long, &m)
	if !IsFieldError(err) || CodeOf(err) != CodeInvalidLabel || m.ID != 1 {
		t.Errorf("long label: %v (code %v, id %d)", err, CodeOf(err), m.ID)
	}
	if _, err := AppendMsg(nil, &Msg{Type: TypeAcquire, ID: 1, Key: "k", Owner: "o", Lease: 1, Label: strings.Repeat("l", 65)}); CodeOf(err) != CodeInvalidLabel {
		t.Errorf("AppendMsg with a long label: %v", err)
	}
	if ValidLabel("a b") != locksm.ErrInvalidLabel || ValidLabel("") != nil || ValidLabel("req/1") != nil {
		t.Error("ValidLabel")
	}
	if CodeInvalidLabel.String() != "invalid_label" || ErrOf(CodeInvalidLabel) != locksm.ErrInvalidLabel {
		t.Error("invalid_label code")
	}
}
