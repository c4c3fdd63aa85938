package wire

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// Admin frames use the framing of every other frame: what WriteFrame
// writes Reader.ReadFrame reads back, and a payload over MaxPayloadLen is
// refused on both sides.
func TestAdminFraming(t *testing.T) {
	var buf bytes.Buffer
	small := []byte(`{"op":"members"}`)
	full := bytes.Repeat([]byte{'x'}, MaxPayloadLen)
	for _, p := range [][]byte{small, full, {}} {
		if err := WriteFrame(&buf, TypeAdminRequest, p); err != nil {
			t.Fatalf("WriteFrame of %d bytes: %v", len(p), err)
		}
	}
	if err := WriteFrame(&buf, TypeAdminReply, append(full, 'x')); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("WriteFrame of %d bytes: %v, want ErrFrameTooLarge", MaxPayloadLen+1, err)
	}
	if b, err := AppendFrame([]byte("keep"), TypeAdminReply, append(full, 'x')); err == nil || string(b) != "keep" {
		t.Fatalf("AppendFrame of an oversized payload: %q, %v", b, err)
	}
	r := NewReader(&buf)
	for _, want := range [][]byte{small, full, {}} {
		typ, p, err := r.ReadFrame()
		if err != nil || typ != TypeAdminRequest || !bytes.Equal(p, want) {
			t.Fatalf("ReadFrame: %s %d bytes %v, want 'j' with %d bytes", TypeName(typ), len(p), err, len(want))
		}
	}
	// A length prefix above MaxFrameLen is refused before its payload.
	over := []byte{0, 0, 0x20, 0x01, TypeAdminRequest}
	if _, _, err := NewReader(bytes.NewReader(over)).ReadFrame(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("ReadFrame of a %d-byte length: %v, want ErrFrameTooLarge", MaxFrameLen+1, err)
	}
	// The writer keeps to the bound of versions 1–4, so that a reply fits
	// an older tool's reader: one byte over it is refused.
	if MaxPayloadLen != MaxFrameLenV4-1 || MaxFrameLenV4 != 4096 || MaxFrameLen != 8192 {
		t.Fatalf("MaxPayloadLen %d, MaxFrameLenV4 %d, MaxFrameLen %d", MaxPayloadLen, MaxFrameLenV4, MaxFrameLen)
	}
}

// The admin frame types are none of the client protocol's, so a client
// port refuses them as it refuses any unknown type.
func TestAdminTypesApart(t *testing.T) {
	for _, typ := range []byte{TypeAdminRequest, TypeAdminReply} {
		if IsRequest(typ) || IsReply(typ) || IsNotice(typ) || isHandshake(typ) {
			t.Errorf("%s is also a client-protocol frame type", TypeName(typ))
		}
		var m Msg
		if err := DecodeMsg(typ, make([]byte, 8), &m); !errors.Is(err, ErrUnknownType) {
			t.Errorf("DecodeMsg(%s): %v, want ErrUnknownType", TypeName(typ), err)
		}
	}
	if len(AdminCodes) != len(slices.Compact(slices.Sorted(slices.Values(AdminCodes)))) {
		t.Errorf("AdminCodes has duplicates: %v", AdminCodes)
	}
}

// The tolerance formula at the cluster sizes a replacement passes through.
func TestTolerance(t *testing.T) {
	for _, c := range []struct{ v, h, want int }{
		{3, 3, 1}, {3, 2, 0}, {2, 2, 0}, {4, 3, 0}, {4, 4, 1}, {5, 5, 2}, {5, 3, 0}, {4, 4, 1}, {6, 6, 2}, {6, 5, 1}, {3, 1, -1}, {5, 2, -1},
	} {
		if got := Tolerance(c.v, c.h); got != c.want {
			t.Errorf("Tolerance(%d, %d) = %d, want %d", c.v, c.h, got, c.want)
		}
	}
}

// Every admin reply code but "internal" has its sentinel, each sentinel
// maps back to its code (also wrapped, and wrapped with the sentinels a
// refusal may carry besides), and nothing maps to a code AdminCodes does
// not list.
func TestAdminCodeTable(t *testing.T) {
	for _, code := range AdminCodes {
		err := AdminErrOf(code)
		if code == AdminInternal {
			if err != nil {
				t.Errorf("AdminErrOf(%q) = %v, want nil", code, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("admin code %q has no sentinel", code)
			continue
		}
		if got := AdminCodeOf(fmt.Errorf("op: %w", err)); got != code {
			t.Errorf("AdminCodeOf(%v) = %q, want %q", err, got, code)
		}
	}
	for _, c := range adminCodeTable {
		if !slices.Contains(AdminCodes, c.code) {
			t.Errorf("%v maps to %q, which AdminCodes does not list", c.err, c.code)
		}
	}
	if got := AdminCodeOf(fmt.Errorf("%w: %w", ErrUnsafeChange, ErrNoVoterMajority)); got != AdminNoQuorum {
		t.Errorf("a refusal for want of a quorum answers %q, want %q", got, AdminNoQuorum)
	}
	if got := AdminCodeOf(errors.New("disk on fire")); got != AdminInternal {
		t.Errorf("an unknown error answers %q, want internal", got)
	}
	if AdminErrOf("from_a_later_version") != nil {
		t.Error("an unknown code has a sentinel")
	}
}
