package wire

import "io"

// SplitFrame is the incremental frame parser: given the bytes received so
// far, it returns the first complete frame's type and payload (aliasing b)
// and the number of bytes it used. n == 0 and err == nil mean "need more
// bytes". A length of 0 or above MaxFrameLen gives ErrFrameTooLarge or
// ErrMalformed with a quoted snippet, before the rest of the frame arrives.
func SplitFrame(b []byte) (typ byte, payload []byte, n int, err error) { panic("TODO") }

// DecodeMsg decodes a post-handshake frame into m (which it overwrites).
// Errors wrap ErrMalformed or ErrUnknownType.
func DecodeMsg(typ byte, payload []byte, m *Msg) error { panic("TODO") }

// AppendMsg appends m as one complete frame to dst. It fails (without
// appending) if a field does not fit its encoding or the frame would exceed
// MaxFrameLen.
func AppendMsg(dst []byte, m *Msg) ([]byte, error) { panic("TODO") }

// Reader reads frames from a stream with a bounded buffer (MaxFrameLen+5).
type Reader struct{}

// NewReader wraps r.
func NewReader(r io.Reader) *Reader { panic("TODO") }

// ReadFrame returns the next frame; payload is valid until the next call.
func (r *Reader) ReadFrame() (typ byte, payload []byte, err error) { panic("TODO") }

// ReadMsg reads and decodes the next post-handshake message.
func (r *Reader) ReadMsg(m *Msg) error { panic("TODO") }
