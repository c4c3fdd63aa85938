package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"

	"ticketing/locksm"
)

// headerLen is the size of the length prefix.
const headerLen = 4

// MaxFrameBytes is the largest complete frame on the wire: the length prefix
// plus MaxFrameLen bytes (type and payload). Reader's buffer has this size.
const MaxFrameBytes = headerLen + MaxFrameLen

// MaxTextLen is the longest text a TypeError or TypeUnknown can carry: what
// is left of MaxFrameLenV4 (the bound of every type but TypeAcquireBlock)
// after type, id, code and the str16 length.
const MaxTextLen = MaxFrameLenV4 - 1 - 8 - 2 - 2

// maxFrameLenOf is the bound of a frame of type typ: MaxFrameLen for
// TypeAcquireBlock, MaxFrameLenV4 for every other type, in every version.
func maxFrameLenOf(typ byte) int {
	if typ == TypeAcquireBlock {
		return MaxFrameLen
	}
	return MaxFrameLenV4
}

// SplitFrame is the incremental frame parser: given the bytes received so
// far, it returns the first complete frame's type and payload (aliasing b)
// and the number of bytes it used. n == 0 and err == nil mean "need more
// bytes". A length of 0 (ErrMalformed) or above MaxFrameLen
// (ErrFrameTooLarge) is reported as soon as the 4-byte header is visible,
// before the rest of the frame arrives, so a peer speaking another protocol
// (an HTTP probe, say) is refused at once instead of being waited for; the
// error quotes the first bytes in hex and ASCII for the log.
//
// SplitFrame does no I/O, holds no state and does not look at the type byte:
// DecodeMsg (or the handshake) judges the type.
func SplitFrame(b []byte) (typ byte, payload []byte, n int, err error) {
	if len(b) < headerLen {
		return 0, nil, 0, nil
	}
	length := binary.BigEndian.Uint32(b)
	if length == 0 {
		return 0, nil, 0, fmt.Errorf("%w: length 0 (bytes %s)", ErrMalformed, Snippet(b))
	}
	if length > MaxFrameLen {
		return 0, nil, 0, fmt.Errorf("%w: length %d > %d (bytes %s)", ErrFrameTooLarge, length, MaxFrameLen, Snippet(b))
	}
	end := headerLen + int(length)
	if len(b) < end {
		return 0, nil, 0, nil
	}
	return b[headerLen], b[headerLen+1 : end : end], end, nil
}

// MaxPayloadLen is the largest payload AppendFrame writes: MaxFrameLenV4
// less the type byte, so that an admin frame fits every version's reader.
// (Only the block acquire's payload can be longer; see MaxFrameLen.)
const MaxPayloadLen = MaxFrameLenV4 - 1

// AppendFrame appends one frame of type typ carrying payload to dst. It
// fails, without appending, with ErrFrameTooLarge when the payload exceeds
// MaxPayloadLen. AppendMsg encodes the binary messages; this is for the
// frames whose payload the framing does not look into (the admin JSON,
// admin.go); Reader.ReadFrame reads either kind.
func AppendFrame(dst []byte, typ byte, payload []byte) ([]byte, error) {
	if len(payload) > MaxPayloadLen {
		return dst, fmt.Errorf("%w: frame %s would be %d bytes > %d", ErrFrameTooLarge, TypeName(typ), 1+len(payload), MaxFrameLenV4)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(1+len(payload)))
	dst = append(dst, typ)
	return append(dst, payload...), nil
}

// WriteFrame writes one frame (AppendFrame) to w in one Write.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	b, err := AppendFrame(make([]byte, 0, headerLen+1+len(payload)), typ, payload)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// snippetLen is how many bytes Snippet quotes.
const snippetLen = 16

// Snippet renders the first bytes of b as hex and as ASCII (non-printable
// bytes as '.'), for error messages about bytes a peer sent: short enough for
// one log line, recognisable when someone points the wrong protocol at a port.
func Snippet(b []byte) string {
	more := ""
	if len(b) > snippetLen {
		b, more = b[:snippetLen], "…"
	}
	buf := make([]byte, 0, 5*len(b)+8)
	for i, c := range b {
		if i > 0 {
			buf = append(buf, ' ')
		}
		buf = append(buf, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
	}
	buf = append(buf, more...)
	buf = append(buf, ' ', '"')
	for _, c := range b {
		if c < 0x20 || c > 0x7E || c == '"' || c == '\\' {
			c = '.'
		}
		buf = append(buf, c)
	}
	buf = append(buf, '"')
	buf = append(buf, more...)
	return string(buf)
}

// TypeName is a short printable name for a frame type: its letter when it
// is printable, else its hex value.
func TypeName(typ byte) string {
	if typ >= 0x21 && typ <= 0x7E {
		return "'" + string(rune(typ)) + "'"
	}
	return "0x" + strconv.FormatUint(uint64(typ), 16)
}

// decoder reads a payload field by field. The first failure sticks (later
// reads return zero values) so the per-type code stays a flat list of reads
// followed by one check; errors are only built on the failure path.
type decoder struct {
	b    []byte
	fail bool
}

func (d *decoder) take(n int) []byte {
	if d.fail || len(d.b) < n {
		d.fail = true
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) u8() byte {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if p := d.take(2); p != nil {
		return binary.BigEndian.Uint16(p)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.BigEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.BigEndian.Uint64(p)
	}
	return 0
}

func (d *decoder) str8() string {
	n := int(d.u8())
	return string(d.take(n))
}

func (d *decoder) str16() string {
	n := int(d.u16())
	return string(d.take(n))
}

// done reports whether every read fitted and nothing is left over.
func (d *decoder) done() bool { return !d.fail && len(d.b) == 0 }

// DecodeMsg decodes a post-handshake frame into m (which it overwrites).
//
// It validates the payload exactly: the fixed fields and every str8/str16
// must fit, nothing may trail, the frame is within its type's bound
// (MaxFrameLenV4 for every type but TypeAcquireBlock), a block acquire
// names locksm.MinBlockKeys..MaxBlockKeys keys (their alphabet and
// distinctness are locksm's checks, ValidateCommand), request ids (and
// cancel targets) are nonzero,
// reply and progress (TypeQueued) ids are nonzero except for TypeError
// (id 0 = connection error),
// a TypeNotice's id is 0 and its event known,
// error codes are nonzero, roles are known, and keys and owners have
// locksm's lengths (1..MaxKeyLen, 1..MaxOwnerLen; their alphabet is checked
// by locksm or ValidKey/ValidOwner).
//
// Errors wrap ErrMalformed, ErrUnknownType, or ErrUnexpectedFrame (a
// handshake frame after the handshake). A key or owner of the wrong length
// also wraps locksm.ErrInvalidKey / ErrInvalidOwner, so CodeOf answers
// invalid_key / invalid_owner as locksm would. On error, m.Type is set, and
// m.ID too when the payload holds one, so a server can answer a request
// under its id instead of dropping the connection.
func DecodeMsg(typ byte, payload []byte, m *Msg) error {
	*m = Msg{Type: typ}
	d := decoder{b: payload}
	isReq := IsRequest(typ)
	if !isReq && !IsReply(typ) && !IsNotice(typ) && !IsEvent(typ) && !IsProgress(typ) {
		if isHandshake(typ) {
			return fmt.Errorf("%w: handshake frame %s after the handshake", ErrUnexpectedFrame, TypeName(typ))
		}
		return fmt.Errorf("%w: %s (payload %s)", ErrUnknownType, TypeName(typ), Snippet(payload))
	}
	m.ID = d.u64()
	if d.fail {
		return malformed(typ, "short id", payload)
	}
	if bound := maxFrameLenOf(typ); 1+len(payload) > bound {
		return malformed(typ, fmt.Sprintf("%d bytes > %d (only %s may be longer)", 1+len(payload), bound, TypeName(TypeAcquireBlock)), payload)
	}
	switch typ {
	case TypeAcquire, TypeAcquirePermit:
		m.Lease = d.u16()
		m.WaitMs = d.u32()
		m.Key = d.str8()
		m.Owner = d.str8()
		if !d.fail && len(d.b) > 0 {
			if m.Label = d.str8(); !d.fail && m.Label == "" {
				return malformed(typ, "empty label (no label is no field)", payload)
			}
		}
	case TypeAcquireBlock:
		m.Lease = d.u16()
		m.WaitMs = d.u32()
		m.Owner = d.str8()
		n := int(d.u8())
		if !d.fail && (n < locksm.MinBlockKeys || n > locksm.MaxBlockKeys) {
			return malformed(typ, fmt.Sprintf("%d keys, not %d..%d", n, locksm.MinBlockKeys, locksm.MaxBlockKeys), payload)
		}
		if !d.fail {
			m.Keys = make([]string, n)
			for i := range m.Keys {
				m.Keys[i] = d.str8()
			}
		}
		if !d.fail && len(d.b) > 0 {
			if m.Label = d.str8(); !d.fail && m.Label == "" {
				return malformed(typ, "empty label (no label is no field)", payload)
			}
		}
	case TypeRelease:
		m.Token = d.u64()
		m.Key = d.str8()
		m.Owner = d.str8()
	case TypeExtend:
		m.Token = d.u64()
		m.Lease = d.u16()
		m.Key = d.str8()
		m.Owner = d.str8()
	case TypeLost:
		m.Token = d.u64()
		m.Reason = LostReason(d.u8())
		m.Key = d.str8()
		if m.Reason == LostRevoked {
			m.Owner = d.str8()
			m.Text = d.str8()
		}
	case TypePosition:
		m.Position = d.u32()
		m.EstimateMs = d.u32()
		m.Key = d.str8()
	case TypeCancel:
		m.Target = d.u64()
	case TypeOpenSession:
		m.Session = d.u64()
		m.TimeoutMs = d.u32()
		copy(m.Secret[:], d.take(SecretLen))
	case TypeResume:
		m.Session = d.u64()
		copy(m.Secret[:], d.take(SecretLen))
		m.High = d.u64()
		m.Serial = d.u64()
	case TypeSessionAck:
		m.Serial = d.u64()
	case TypeOutcomes:
		m.Session = d.u64()
		m.Serial = d.u64()
	case TypeGranted:
		m.Token = d.u64()
		if !d.fail && len(d.b) > 0 {
			m.Permit, m.Slot = true, d.u32()
		}
	case TypeSetPermits:
		m.Permits = d.u32()
		m.Key = d.str8()
	case TypeMoved:
		m.LeaderAddr = d.str8()
		m.LeaderID = d.str8()
	case TypeUnknown:
		m.Text = d.str16()
	case TypeError:
		m.Code = Code(d.u16())
		m.Text = d.str16()
	case TypeNotice:
		m.Event = NoticeEvent(d.u8())
		m.LeaderID = d.str8()
		m.LeaderAddr = d.str8()
	case TypeStatusR:
		m.NodeID = d.str8()
		m.Role = Role(d.u8())
		m.Term = d.u64()
		m.LeaderID = d.str8()
		m.LeaderAddr = d.str8()
		m.Commit = d.u64()
		m.Applied = d.u64()
		m.LastToken = d.u64()
		m.Held = d.u64()
		m.Waiting = d.u64()
	case TypeMembersR:
		n := int(d.u8())
		// Each member takes at least 3 bytes: a count beyond the payload is
		// malformed before anything is allocated for it.
		if n > 0 && 3*n <= len(d.b) {
			m.Members = make([]Member, n)
			for i := range m.Members {
				m.Members[i] = Member{ServerID: d.str8(), Suffrage: Suffrage(d.u8()), ClientAddr: d.str8()}
			}
		} else if n > 0 {
			d.fail = true
		}
	}
	if !d.done() {
		if d.fail {
			return malformed(typ, "truncated payload or string length beyond it", payload)
		}
		return malformed(typ, strconv.Itoa(len(d.b))+" trailing bytes", payload)
	}
	if err := checkFields(m); err != nil {
		return fmt.Errorf("%w (frame %s)", err, TypeName(typ))
	}
	return nil
}

func malformed(typ byte, what string, payload []byte) error {
	return fmt.Errorf("%w: frame %s: %s (payload %s)", ErrMalformed, TypeName(typ), what, Snippet(payload))
}

// checkFields holds the value rules shared by DecodeMsg and AppendMsg, so
// that whatever AppendMsg writes DecodeMsg accepts and vice versa.
func checkFields(m *Msg) error {
	if m.ID == 0 && m.Type != TypeError && m.Type != TypeNotice && m.Type != TypeLost && m.Type != TypeOutcomes {
		return fmt.Errorf("%w: id 0", ErrMalformed)
	}
	switch m.Type {
	case TypeOpenSession, TypeResume:
		// The timeout's bounds are locksm's check (invalid_session, under
		// the request's id); the shape is the frame's.
		if m.Session == 0 {
			return fmt.Errorf("%w: session 0", ErrMalformed)
		}
	case TypeOutcomes:
		if m.ID != 0 {
			return fmt.Errorf("%w: outcomes event with id %d (events answer no request)", ErrMalformed, m.ID)
		}
		if m.Session == 0 {
			return fmt.Errorf("%w: outcomes event for session 0", ErrMalformed)
		}
	case TypeLost:
		if m.ID != 0 {
			return fmt.Errorf("%w: lost event with id %d (events answer no request)", ErrMalformed, m.ID)
		}
		if m.Reason != LostExpired && m.Reason != LostRevoked {
			return fmt.Errorf("%w: lost reason %d", ErrMalformed, m.Reason)
		}
		if m.Reason != LostRevoked && (m.Owner != "" || m.Text != "") {
			return fmt.Errorf("%w: lost event of reason %d names who and why (only a revoke does)", ErrMalformed, m.Reason)
		}
		if len(m.Owner) > locksm.MaxOwnerLen || len(m.Text) > locksm.MaxReasonLen {
			return fmt.Errorf("%w: lost event's who (%d bytes) or why (%d bytes) over %d or %d", ErrMalformed,
				len(m.Owner), len(m.Text), locksm.MaxOwnerLen, locksm.MaxReasonLen)
		}
		if m.Token == 0 {
			return fmt.Errorf("%w: lost event for token 0", ErrMalformed)
		}
		if len(m.Key) == 0 || len(m.Key) > locksm.MaxKeyLen {
			// Plain malformed: an event has no id to answer a field error under.
			return fmt.Errorf("%w: lost event key length %d not in 1..%d", ErrMalformed, len(m.Key), locksm.MaxKeyLen)
		}
	case TypeNotice:
		if m.ID != 0 {
			return fmt.Errorf("%w: notice with id %d (notices answer no request)", ErrMalformed, m.ID)
		}
		if m.Event != NoticeHandOver && m.Event != NoticeServing {
			return fmt.Errorf("%w: notice event %d", ErrMalformed, m.Event)
		}
	case TypeSetPermits:
		if len(m.Key) == 0 || len(m.Key) > locksm.MaxKeyLen {
			return fmt.Errorf("%w: %w: key length %d not in 1..%d", ErrMalformed, locksm.ErrInvalidKey, len(m.Key), locksm.MaxKeyLen)
		}
	case TypeAcquire, TypeRelease, TypeExtend, TypeAcquirePermit:
		if len(m.Key) == 0 || len(m.Key) > locksm.MaxKeyLen {
			return fmt.Errorf("%w: %w: key length %d not in 1..%d", ErrMalformed, locksm.ErrInvalidKey, len(m.Key), locksm.MaxKeyLen)
		}
		if len(m.Owner) == 0 || len(m.Owner) > locksm.MaxOwnerLen {
			return fmt.Errorf("%w: %w: owner length %d not in 1..%d", ErrMalformed, locksm.ErrInvalidOwner, len(m.Owner), locksm.MaxOwnerLen)
		}
		if err := checkLabelLen(m); err != nil {
			return err
		}
	case TypeAcquireBlock:
		// The count is the frame's shape (malformed); the keys' lengths
		// are field errors, as an acquire's key. Distinct keys and their
		// alphabet are locksm's checks (ValidateCommand): invalid_keys,
		// invalid_key.
		if len(m.Keys) < locksm.MinBlockKeys || len(m.Keys) > locksm.MaxBlockKeys {
			return fmt.Errorf("%w: %d keys, not %d..%d", ErrMalformed, len(m.Keys), locksm.MinBlockKeys, locksm.MaxBlockKeys)
		}
		for i, k := range m.Keys {
			if len(k) == 0 || len(k) > locksm.MaxKeyLen {
				return fmt.Errorf("%w: %w: key %d length %d not in 1..%d", ErrMalformed, locksm.ErrInvalidKey, i+1, len(k), locksm.MaxKeyLen)
			}
		}
		if len(m.Owner) == 0 || len(m.Owner) > locksm.MaxOwnerLen {
			return fmt.Errorf("%w: %w: owner length %d not in 1..%d", ErrMalformed, locksm.ErrInvalidOwner, len(m.Owner), locksm.MaxOwnerLen)
		}
		if err := checkLabelLen(m); err != nil {
			return err
		}
	case TypeCancel:
		if m.Target == 0 {
			return fmt.Errorf("%w: cancel target 0", ErrMalformed)
		}
	case TypePosition:
		if m.Position == 0 {
			return fmt.Errorf("%w: position 0 (the head is 1)", ErrMalformed)
		}
		if len(m.Key) == 0 || len(m.Key) > locksm.MaxKeyLen {
			// Plain malformed: progress is not answered under its id.
			return fmt.Errorf("%w: position key length %d not in 1..%d", ErrMalformed, len(m.Key), locksm.MaxKeyLen)
		}
	case TypeError:
		if m.Code == 0 {
			return fmt.Errorf("%w: error code 0", ErrMalformed)
		}
	case TypeStatusR:
		if m.Role > RoleShutdown {
			return fmt.Errorf("%w: role %d", ErrMalformed, m.Role)
		}
	case TypeMembersR:
		if len(m.Members) > 255 {
			return fmt.Errorf("%w: %d members", ErrMalformed, len(m.Members))
		}
		for _, mb := range m.Members {
			if mb.ServerID == "" || mb.Suffrage > SuffrageLearner {
				return fmt.Errorf("%w: member %q suffrage %d", ErrMalformed, mb.ServerID, mb.Suffrage)
			}
		}
	}
	return nil
}

// checkLabelLen checks the length of an acquire's label. An empty label
// that was sent (a str8 of length 0 after the last field) decodes as "",
// and re-encodes without it: DecodeMsg rejects it before this, as a
// frame with another canonical form. The alphabet is
// locksm's check (invalid_label).
func checkLabelLen(m *Msg) error {
	if len(m.Label) > locksm.MaxLabelLen {
		return fmt.Errorf("%w: %w: label length %d not in 0..%d", ErrMalformed, locksm.ErrInvalidLabel, len(m.Label), locksm.MaxLabelLen)
	}
	return nil
}

// errTooLong reports a string that does not fit its length prefix.
var errTooLong = errors.New("string too long for its length prefix")

// payloadLen returns the encoded payload size of m and checks that every
// string fits its length prefix.
func payloadLen(m *Msg) (int, error) {
	s8 := func(s string) int {
		if len(s) > 255 {
			return -1 << 30
		}
		return 1 + len(s)
	}
	s16 := func(s string) int {
		if len(s) > 0xFFFF {
			return -1 << 30
		}
		return 2 + len(s)
	}
	n := 8 // id
	switch m.Type {
	case TypeAcquire, TypeAcquirePermit:
		n += 2 + 4 + s8(m.Key) + s8(m.Owner) + labelLen(m.Label)
	case TypeSetPermits:
		n += 4 + s8(m.Key)
	case TypeAcquireBlock:
		n += 2 + 4 + s8(m.Owner) + 1 + labelLen(m.Label)
		if len(m.Keys) > 255 {
			n = -1 << 30 // the count does not fit its u8
		}
		for _, k := range m.Keys {
			n += s8(k)
		}
	case TypeRelease:
		n += 8 + s8(m.Key) + s8(m.Owner)
	case TypeExtend:
		n += 8 + 2 + s8(m.Key) + s8(m.Owner)
	case TypeLost:
		n += 8 + 1 + s8(m.Key)
		if m.Reason == LostRevoked {
			n += s8(m.Owner) + s8(m.Text)
		}
	case TypePosition:
		n += 4 + 4 + s8(m.Key)
	case TypeCancel, TypeSessionAck:
		n += 8
	case TypeGranted:
		n += 8
		if m.Permit {
			n += 4
		}
	case TypeOpenSession:
		n += 8 + 4 + SecretLen
	case TypeResume:
		n += 8 + SecretLen + 8 + 8
	case TypeOutcomes:
		n += 8 + 8
	case TypePing, TypeStatus, TypeMembers, TypeNoticeAck, TypeBusy, TypeTimeout, TypeOK, TypePong, TypeQueued, TypeCloseSession,
		TypeWatchPositions:
	case TypeMoved:
		n += s8(m.LeaderAddr) + s8(m.LeaderID)
	case TypeNotice:
		n += 1 + s8(m.LeaderID) + s8(m.LeaderAddr)
	case TypeUnknown:
		n += s16(m.Text)
	case TypeError:
		n += 2 + s16(m.Text)
	case TypeStatusR:
		n += s8(m.NodeID) + 1 + 8 + s8(m.LeaderID) + s8(m.LeaderAddr) + 5*8
	case TypeMembersR:
		n++
		for _, mb := range m.Members {
			n += s8(mb.ServerID) + 1 + s8(mb.ClientAddr)
		}
	default:
		return 0, fmt.Errorf("%w: cannot encode %s", ErrUnknownType, TypeName(m.Type))
	}
	if n < 0 {
		return 0, fmt.Errorf("%w: frame %s: %w", ErrMalformed, TypeName(m.Type), errTooLong)
	}
	return n, nil
}

// labelLen is what an acquire's optional label adds: nothing when it has
// none.
func labelLen(l string) int {
	if l == "" {
		return 0
	}
	if len(l) > 255 {
		return -1 << 30
	}
	return 1 + len(l)
}

// AppendMsg appends m as one complete frame to dst. It encodes only the
// fields m.Type uses (others are ignored) and fails, without appending, if a
// field does not fit its encoding, breaks a rule DecodeMsg enforces, or the
// frame would exceed its type's bound (ErrFrameTooLarge: MaxFrameLen for
// TypeAcquireBlock, MaxFrameLenV4 for the others). With enough capacity in
// dst it does not allocate.
func AppendMsg(dst []byte, m *Msg) ([]byte, error) {
	n, err := payloadLen(m)
	if err != nil {
		return dst, err
	}
	if bound := maxFrameLenOf(m.Type); 1+n > bound {
		return dst, fmt.Errorf("%w: frame %s would be %d bytes > %d", ErrFrameTooLarge, TypeName(m.Type), 1+n, bound)
	}
	if err := checkFields(m); err != nil {
		return dst, fmt.Errorf("%w (frame %s)", err, TypeName(m.Type))
	}
	b := binary.BigEndian.AppendUint32(dst, uint32(1+n))
	b = append(b, m.Type)
	b = binary.BigEndian.AppendUint64(b, m.ID)
	switch m.Type {
	case TypeAcquire, TypeAcquirePermit:
		b = binary.BigEndian.AppendUint16(b, m.Lease)
		b = binary.BigEndian.AppendUint32(b, m.WaitMs)
		b = appendStr8(b, m.Key)
		b = appendStr8(b, m.Owner)
		if m.Label != "" {
			b = appendStr8(b, m.Label)
		}
	case TypeSetPermits:
		b = binary.BigEndian.AppendUint32(b, m.Permits)
		b = appendStr8(b, m.Key)
	case TypeAcquireBlock:
		b = binary.BigEndian.AppendUint16(b, m.Lease)
		b = binary.BigEndian.AppendUint32(b, m.WaitMs)
		b = appendStr8(b, m.Owner)
		b = append(b, byte(len(m.Keys)))
		for _, k := range m.Keys {
			b = appendStr8(b, k)
		}
		if m.Label != "" {
			b = appendStr8(b, m.Label)
		}
	case TypeRelease:
		b = binary.BigEndian.AppendUint64(b, m.Token)
		b = appendStr8(b, m.Key)
		b = appendStr8(b, m.Owner)
	case TypeExtend:
		b = binary.BigEndian.AppendUint64(b, m.Token)
		b = binary.BigEndian.AppendUint16(b, m.Lease)
		b = appendStr8(b, m.Key)
		b = appendStr8(b, m.Owner)
	case TypeLost:
		b = binary.BigEndian.AppendUint64(b, m.Token)
		b = append(b, byte(m.Reason))
		b = appendStr8(b, m.Key)
		if m.Reason == LostRevoked {
			b = appendStr8(b, m.Owner)
			b = appendStr8(b, m.Text)
		}
	case TypePosition:
		b = binary.BigEndian.AppendUint32(b, m.Position)
		b = binary.BigEndian.AppendUint32(b, m.EstimateMs)
		b = appendStr8(b, m.Key)
	case TypeCancel:
		b = binary.BigEndian.AppendUint64(b, m.Target)
	case TypeOpenSession:
		b = binary.BigEndian.AppendUint64(b, m.Session)
		b = binary.BigEndian.AppendUint32(b, m.TimeoutMs)
		b = append(b, m.Secret[:]...)
	case TypeResume:
		b = binary.BigEndian.AppendUint64(b, m.Session)
		b = append(b, m.Secret[:]...)
		b = binary.BigEndian.AppendUint64(b, m.High)
		b = binary.BigEndian.AppendUint64(b, m.Serial)
	case TypeSessionAck:
		b = binary.BigEndian.AppendUint64(b, m.Serial)
	case TypeOutcomes:
		b = binary.BigEndian.AppendUint64(b, m.Session)
		b = binary.BigEndian.AppendUint64(b, m.Serial)
	case TypeGranted:
		b = binary.BigEndian.AppendUint64(b, m.Token)
		if m.Permit {
			b = binary.BigEndian.AppendUint32(b, m.Slot)
		}
	case TypeMoved:
		b = appendStr8(b, m.LeaderAddr)
		b = appendStr8(b, m.LeaderID)
	case TypeNotice:
		b = append(b, byte(m.Event))
		b = appendStr8(b, m.LeaderID)
		b = appendStr8(b, m.LeaderAddr)
	case TypeUnknown:
		b = appendStr16(b, m.Text)
	case TypeError:
		b = binary.BigEndian.AppendUint16(b, uint16(m.Code))
		b = appendStr16(b, m.Text)
	case TypeStatusR:
		b = appendStr8(b, m.NodeID)
		b = append(b, byte(m.Role))
		b = binary.BigEndian.AppendUint64(b, m.Term)
		b = appendStr8(b, m.LeaderID)
		b = appendStr8(b, m.LeaderAddr)
		b = binary.BigEndian.AppendUint64(b, m.Commit)
		b = binary.BigEndian.AppendUint64(b, m.Applied)
		b = binary.BigEndian.AppendUint64(b, m.LastToken)
		b = binary.BigEndian.AppendUint64(b, m.Held)
		b = binary.BigEndian.AppendUint64(b, m.Waiting)
	case TypeMembersR:
		b = append(b, byte(len(m.Members)))
		for _, mb := range m.Members {
			b = appendStr8(b, mb.ServerID)
			b = append(b, byte(mb.Suffrage))
			b = appendStr8(b, mb.ClientAddr)
		}
	}
	return b, nil
}

// appendStr8 and appendStr16 assume the caller checked the length.
func appendStr8(b []byte, s string) []byte {
	return append(append(b, byte(len(s))), s...)
}

func appendStr16(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint16(b, uint16(len(s))), s...)
}

// Reader reads frames from a stream with a bounded buffer of MaxFrameBytes
// (the largest legal frame), so a peer cannot make it grow. One Read may
// bring many small frames; they are then split without further syscalls.
// A Reader is not safe for concurrent use.
type Reader struct {
	r    io.Reader
	buf  []byte
	head int   // start of unparsed bytes
	tail int   // end of received bytes
	rerr error // error of the last Read, reported once its data is used
	err  error // sticky error returned by every later call
}

// NewReader wraps r.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: r, buf: make([]byte, MaxFrameBytes)}
}

// ReadFrame returns the next frame; payload is valid until the next call.
// At a frame boundary a clean end of stream is io.EOF; inside a frame it is
// io.ErrUnexpectedEOF. Framing errors (SplitFrame's) and read errors are
// sticky: the stream cannot be resynchronised after them.
func (r *Reader) ReadFrame() (typ byte, payload []byte, err error) {
	for {
		if r.err != nil {
			return 0, nil, r.err
		}
		typ, payload, n, err := SplitFrame(r.buf[r.head:r.tail])
		if err != nil {
			r.err = err
			return 0, nil, err
		}
		if n > 0 {
			r.head += n
			return typ, payload, nil
		}
		// Need more bytes. The previous payload is no longer promised to
		// the caller, so unparsed bytes may move to the front.
		if r.head == r.tail {
			r.head, r.tail = 0, 0
		} else if r.tail == len(r.buf) {
			r.tail = copy(r.buf, r.buf[r.head:r.tail])
			r.head = 0
		}
		if r.rerr != nil {
			// No complete frame left before the read error.
			r.err = r.rerr
			if r.err == io.EOF && r.head != r.tail {
				r.err = io.ErrUnexpectedEOF
			}
			continue
		}
		m, err := r.r.Read(r.buf[r.tail:])
		r.tail += m
		// An error that came with data is kept until that data is split.
		r.rerr = err
	}
}

// Buffered returns how many received bytes are not yet returned as frames.
func (r *Reader) Buffered() int { return r.tail - r.head }

// ReadMsg reads and decodes the next post-handshake message. A decoding
// error is not sticky: framing is intact, so the caller may go on reading.
func (r *Reader) ReadMsg(m *Msg) error {
	typ, payload, err := r.ReadFrame()
	if err != nil {
		return err
	}
	return DecodeMsg(typ, payload, m)
}

// IsFieldError reports whether err, from DecodeMsg, concerns only the value
// of a request's key (a block acquire's: any of its keys), owner or label
// (wrong length): the frame was well formed and
// m.ID is valid, so a server should answer E(invalid_key / invalid_owner)
// under that id and keep the connection, instead of treating it as a
// connection error that would leave every other request in flight on the
// connection indeterminate.
func IsFieldError(err error) bool {
	return errors.Is(err, locksm.ErrInvalidKey) || errors.Is(err, locksm.ErrInvalidOwner) || errors.Is(err, locksm.ErrInvalidLabel)
}
