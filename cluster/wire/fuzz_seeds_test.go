package wire

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"ticketing/locksm"
)

// This file holds, for the fuzz targets in fuzz_test.go:
//
//   - reference parsers written from PROTOCOL.md ("Framing",
//     "Handshake") that share no code with the package, so a target can
//     compare the implementation with an independent reading of the spec;
//   - the named seeds, and TestWriteFuzzSeedCorpus, which writes them to
//     testdata/fuzz/<FuzzName>/ in Go's corpus format:
//
//	go test ./cluster/wire -run '^TestWriteFuzzSeedCorpus$' -wire.writecorpus
//
// Files found by fuzzing (crashers kept as regression seeds) live in the
// same directories under their hash names; the writer never removes them.

var writeCorpus = flag.Bool("wire.writecorpus", false, "write the fuzz seed corpus to testdata/fuzz")

var (
	nextPeerSecret = []byte("next-peer-secret-0123456789")
	strangerSecret = []byte("stranger-secret-qwertyuiop")
)

// Spec constants, spelled out again rather than taken from the package.
const (
	specServerLabel = "ticketing/server/v1"
	specClientLabel = "ticketing/client/v1"
	specMaxFrameLen = 8192
)

// specWelcome is the Welcome of versions 2 and 3 (empty payload);
// specWelcome4 the version 4 one, which carries the node's per-connection
// limits: max_in_flight u32 | max_waiters u32.
var specWelcome = []byte{0, 0, 0, 1, 'W'}

func specWelcome4(maxInFlight, maxWaiters uint32) []byte {
	return cat([]byte{0, 0, 0, 9, 'W'}, u32(maxInFlight), u32(maxWaiters))
}

// specWelcomeFor is the Welcome a server with cfg's limits sends in version.
func specWelcomeFor(version uint16, cfg HandshakeConfig) []byte {
	if version >= 4 {
		return specWelcome4(uint32(cfg.MaxInFlight), uint32(cfg.MaxWaiters))
	}
	return specWelcome
}

// specFrame is one frame as PROTOCOL.md's "Framing" section defines it.
type specFrame struct {
	typ     byte
	payload []byte
	raw     []byte // length prefix, type and payload
}

// specNext reads the frame at the start of b. end is how many bytes a
// receiver reading exactly this frame consumes: the whole frame, or up to
// the end of b when it is cut short, or only the 4-byte header when the
// length is invalid (refused at once). err is nil for a complete frame,
// else io.EOF (b is empty: a clean end), io.ErrUnexpectedEOF (cut inside a
// frame), ErrMalformed (length 0) or ErrFrameTooLarge (length > 8192).
func specNext(b []byte) (f specFrame, end int, err error) {
	if len(b) == 0 {
		return f, 0, io.EOF
	}
	if len(b) < 4 {
		return f, len(b), io.ErrUnexpectedEOF
	}
	n := int(b[0])<<24 | int(b[1])<<16 | int(b[2])<<8 | int(b[3])
	switch {
	case n == 0:
		return f, 4, ErrMalformed
	case n > specMaxFrameLen:
		return f, 4, ErrFrameTooLarge
	case len(b) < 4+n:
		return f, len(b), io.ErrUnexpectedEOF
	}
	return specFrame{typ: b[4], payload: b[5 : 4+n], raw: b[:4+n]}, 4 + n, nil
}

// specFrames splits b into complete frames; rest is what does not form one.
func specFrames(b []byte) (frames []specFrame, rest []byte) {
	for {
		f, end, err := specNext(b)
		if err != nil {
			return frames, b
		}
		frames = append(frames, f)
		b = b[end:]
	}
}

// cursor reads payload fields; any shortfall sets bad.
type cursor struct {
	b   []byte
	bad bool
}

func (c *cursor) next(n int) []byte {
	if c.bad || n > len(c.b) {
		c.bad = true
		return nil
	}
	p := c.b[:n]
	c.b = c.b[n:]
	return p
}

func (c *cursor) u8() int {
	if p := c.next(1); p != nil {
		return int(p[0])
	}
	return 0
}

func (c *cursor) u16() uint16 {
	if p := c.next(2); p != nil {
		return uint16(p[0])<<8 | uint16(p[1])
	}
	return 0
}

func (c *cursor) str8() string { return string(c.next(c.u8())) }

func (c *cursor) exact() bool { return !c.bad && len(c.b) == 0 }

type specHello struct {
	minV, maxV                      uint16
	kind                            ConnKind
	cn                              []byte
	cluster, sender, expect, domain string
	// prefixOK: magic, min_version and max_version are there (the version
	// check comes before the version-dependent rest of the layout).
	prefixOK bool
}

// parseSpecHello parses a Hello frame at the start of data; end is where
// the frame ends.
func parseSpecHello(data []byte) (h specHello, end int, ok bool) {
	f, end, err := specNext(data)
	if err != nil || f.typ != 'h' {
		return h, end, false
	}
	c := cursor{b: f.payload}
	magic := c.next(4)
	h.minV, h.maxV = c.u16(), c.u16()
	h.prefixOK = !c.bad && string(magic) == "TKTG"
	h.kind = ConnKind(c.u8())
	h.cn = c.next(32)
	h.cluster, h.sender, h.expect, h.domain = c.str8(), c.str8(), c.str8(), c.str8()
	return h, end, c.exact() && string(magic) == "TKTG"
}

type specChallenge struct {
	version                     uint16
	sn                          []byte
	serverID, clusterID, domain string
	proofs                      [][]byte // as many as the count byte says (0..255)
}

// parseSpecChallenge parses a Challenge payload: ok when the fields fit
// exactly, whatever the proof count (1..2 is the caller's check).
func parseSpecChallenge(p []byte) (ch specChallenge, ok bool) {
	c := cursor{b: p}
	ch.version = c.u16()
	ch.sn = c.next(32)
	ch.serverID, ch.clusterID, ch.domain = c.str8(), c.str8(), c.str8()
	n := c.u8()
	for range n {
		ch.proofs = append(ch.proofs, c.next(32))
	}
	return ch, c.exact()
}

// specTranscript is "Transcript and proofs" of PROTOCOL.md: helloDomain is
// the Hello's domain field, challengeDomain the Challenge's.
func specTranscript(version uint16, kind ConnKind, cn, sn []byte, clusterID, serverID, senderID, expectID,
	helloDomain, challengeDomain string, binding []byte) []byte {
	t := []byte{byte(version >> 8), byte(version), byte(kind)}
	t = append(t, cn...)
	t = append(t, sn...)
	for _, s := range []string{clusterID, serverID, senderID, expectID, helloDomain, challengeDomain, string(binding)} {
		t = append(t, byte(len(s)))
		t = append(t, s...)
	}
	return t
}

// specProof is HMAC-SHA256(secret, label 0x00 transcript).
func specProof(secret []byte, label string, t []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(label))
	h.Write([]byte{0})
	h.Write(t)
	return h.Sum(nil)
}

// clientWant is what a dialler must do with a given server byte stream.
type clientWant struct {
	err      error // nil: the handshake succeeds; else the error it wraps
	proofOK  bool  // the Challenge passed every check: the client sends its Auth
	secret   []byte
	tr       []byte
	ch       specChallenge
	consumed int  // bytes the client reads: its frames, nothing after them
	sendsE   bool // the client detected the failure: it sends E(CodeOf(err))
	mayE     bool // framing or I/O failure: an E is allowed, not required
	// maxInFlight, maxWaiters: the limits a version 4 Welcome told.
	maxInFlight, maxWaiters int
}

// specRemote is the error for a received E frame.
func specRemote(payload []byte) error {
	var m Msg
	if DecodeMsg(TypeError, payload, &m) != nil {
		return ErrMalformed
	}
	return ErrOf(m.Code)
}

// wantClient reads PROTOCOL.md's "Checks and failure behaviour" for the
// client (checks in the documented order: payload, version, cluster id,
// fencing domain, server proof, expected node id), for a zero client nonce.
// The Hello it sent named cfg.Domain.
func wantClient(cfg HandshakeConfig, data []byte) (w clientWant) {
	cn := make([]byte, 32)
	f, end, err := specNext(data)
	w.consumed = end
	if err != nil {
		w.err, w.mayE = err, true
		return w
	}
	switch f.typ {
	case 'C':
	case 'E':
		w.err = specRemote(f.payload)
		return w
	default:
		w.err, w.sendsE = ErrUnexpectedFrame, true
		return w
	}
	w.sendsE = true
	ch, ok := parseSpecChallenge(f.payload)
	switch {
	case !ok || len(ch.proofs) < 1 || len(ch.proofs) > 2:
		w.err = ErrMalformed
		return w
	case ch.version < MinProtocolVersion || ch.version > ProtocolVersion:
		w.err = ErrVersion
		return w
	case ch.clusterID != cfg.ClusterID:
		w.err = ErrWrongCluster
		return w
	case cfg.Domain != "" && ch.domain != "" && ch.domain != cfg.Domain:
		// Both sides name a fencing domain and they differ; refused before
		// the proof is even looked at.
		w.err = ErrWrongDomain
		return w
	}
	w.ch = ch
	w.tr = specTranscript(ch.version, cfg.Kind, cn, ch.sn, ch.clusterID, ch.serverID, cfg.NodeID, cfg.ExpectNodeID,
		cfg.Domain, ch.domain, cfg.ChannelBinding)
	secrets := [][]byte{cfg.Secret}
	if cfg.NextSecret != nil {
		secrets = append(secrets, cfg.NextSecret)
	}
find:
	for _, s := range secrets {
		want := specProof(s, specServerLabel, w.tr)
		for _, p := range ch.proofs {
			if bytes.Equal(p, want) {
				w.secret = s
				break find
			}
		}
	}
	switch {
	case w.secret == nil:
		w.err = ErrAuthFailed
		return w
	case cfg.ExpectNodeID != "" && ch.serverID != cfg.ExpectNodeID &&
		!(cfg.Kind == KindDiscover && strings.HasPrefix(ch.serverID, cfg.ExpectNodeID+"/")):
		// A discovering dialler knows only the name: NAME matches NAME/INC.
		w.err = ErrWrongNode
		return w
	}
	w.proofOK = true
	w.sendsE = false
	f, end2, err := specNext(data[end:])
	w.consumed = end + end2
	switch {
	case err != nil:
		w.err, w.mayE = err, true
	case f.typ == 'E':
		w.err = specRemote(f.payload)
	case f.typ != 'W':
		w.err, w.sendsE = ErrUnexpectedFrame, true
	case w.ch.version < 4 && len(f.payload) != 0:
		w.err, w.sendsE = ErrMalformed, true
	case w.ch.version >= 4 && len(f.payload) != 8:
		// Version 4: max_in_flight u32 | max_waiters u32, exactly.
		w.err, w.sendsE = ErrMalformed, true
	case w.ch.version >= 4:
		w.maxInFlight = int(binary.BigEndian.Uint32(f.payload))
		w.maxWaiters = int(binary.BigEndian.Uint32(f.payload[4:]))
	}
	return w
}

// serverWant is what an accepting node must do with a given client stream.
type serverWant struct {
	err        error // nil: the handshake succeeds
	hello      specHello
	challenges bool // the Hello passed: the server sends its Challenge
	consumed   int  // bytes the server reads: its two frames, nothing more
	sendsE     bool // the server sends E(CodeOf(err))
}

// wantServer reads "Checks and failure behaviour" for the server (no
// channel binding; zero server nonce). A client proof made with either of
// the server's secrets passes.
func wantServer(cfg HandshakeConfig, data []byte) (w serverWant) {
	f, end, err := specNext(data)
	w.consumed = end
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		w.err = err
		return w
	case err != nil:
		w.err, w.sendsE = err, true
		return w
	}
	w.sendsE = true
	if f.typ != 'h' {
		w.err = ErrUnexpectedFrame
		return w
	}
	h, _, ok := parseSpecHello(data)
	version := min(h.maxV, ProtocolVersion)
	switch {
	case h.prefixOK && (h.minV > h.maxV || version < h.minV || version < MinProtocolVersion):
		w.err = ErrVersion
	case !ok:
		w.err = ErrMalformed
	case h.kind != cfg.Kind && !(cfg.Kind == KindPeer && h.kind == KindDiscover):
		w.err = ErrMalformed // the peer port also takes discovery
	case h.cluster != cfg.ClusterID:
		w.err = ErrWrongCluster
	case h.domain != "" && cfg.Domain != "" && h.domain != cfg.Domain:
		w.err = ErrWrongDomain
	case (h.kind == KindPeer || h.kind == KindDiscover || h.expect != "") && h.expect != cfg.NodeID &&
		!(h.kind == KindDiscover && cfg.NodeName != "" && h.expect == cfg.NodeName):
		w.err = ErrWrongNode
	}
	if w.err != nil {
		return w
	}
	w.hello, w.challenges = h, true
	f, end2, err := specNext(data[end:])
	w.consumed = end + end2
	tr := specTranscript(version, h.kind, h.cn, make([]byte, 32), cfg.ClusterID, cfg.NodeID, h.sender, h.expect, h.domain, cfg.Domain, nil)
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		w.err, w.sendsE = err, false
	case err != nil:
		w.err = err
	case f.typ == 'E':
		w.err, w.sendsE = specRemote(f.payload), false
	case f.typ != 'x':
		w.err = ErrUnexpectedFrame
	case len(f.payload) != 32:
		w.err = ErrMalformed
	case !bytes.Equal(f.payload, specProof(cfg.Secret, specClientLabel, tr)) &&
		(cfg.NextSecret == nil || !bytes.Equal(f.payload, specProof(cfg.NextSecret, specClientLabel, tr))):
		w.err = ErrAuthFailed
	default:
		w.sendsE = false
	}
	return w
}

// ---- seed builders ----

type namedSeed struct {
	name string
	data []byte
}

// rawFrame builds a frame with a correct length prefix (which may exceed
// MaxFrameLen: the one-over seeds).
func rawFrame(typ byte, parts ...[]byte) []byte {
	n := 1
	for _, p := range parts {
		n += len(p)
	}
	b := binary.BigEndian.AppendUint32(nil, uint32(n))
	b = append(b, typ)
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func s16(s string) []byte { return append(u16(uint16(len(s))), s...) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func rep(c byte, n int) string { return strings.Repeat(string(rune(c)), n) }

func mustMsg(m Msg) []byte {
	b, err := AppendMsg(nil, &m)
	if err != nil {
		panic(fmt.Sprintf("seed %+v: %v", m, err))
	}
	return b
}

// Foreign protocols pointed at a Ticketing port.
var (
	seedHTTP = []byte("GET / HTTP/1.1\r\nHost: ticketing:7000\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n")
	// A TLS 1.2/1.3 ClientHello record prefix: content type 22, legacy
	// version 3.1, record length 0x0200, handshake type 1, length, 3.3,
	// random, session id.
	seedTLS = cat([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03},
		bytes.Repeat([]byte{0xa5}, 32), []byte{0x20}, bytes.Repeat([]byte{0x5a}, 32),
		[]byte{0x00, 0x3e, 0x13, 0x02, 0x13, 0x03, 0x13, 0x01, 0xc0, 0x2c})
	seedHTTPResponse = []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	seedSSH          = []byte("SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n")
)

// handshakeFrameSeeds are valid handshake frames (for the post-handshake
// decoder they are unexpected frames).
func handshakeFrameSeeds() []namedSeed {
	cn := bytes.Repeat([]byte{7}, 32)
	sn := bytes.Repeat([]byte{0x5a}, 32)
	hello := specHelloFrame(ProtocolVersion, ProtocolVersion, KindClient, cn, "prod", "", "", "")
	tr := specTranscript(ProtocolVersion, KindClient, cn, sn, "prod", "n1", "", "", "", "", nil)
	return []namedSeed{
		{"hs-hello", hello},
		{"hs-challenge", specChallengeFrame(ProtocolVersion, sn, "n1", "prod", "", specProof(clientSecret, specServerLabel, tr))},
		{"hs-auth", rawFrame('x', specProof(clientSecret, specClientLabel, tr))},
		{"hs-welcome", specWelcome},
		{"hs-welcome-v4", specWelcome4(4096, 200000)},
	}
}

func specHelloFrame(minV, maxV uint16, kind ConnKind, cn []byte, cluster, sender, expect, domain string) []byte {
	return rawFrame('h', []byte("TKTG"), u16(minV), u16(maxV), []byte{byte(kind)}, cn, s8(cluster), s8(sender), s8(expect), s8(domain))
}

func specChallengeFrame(version uint16, sn []byte, serverID, clusterID, domain string, proofs ...[]byte) []byte {
	return rawFrame('C', u16(version), sn, s8(serverID), s8(clusterID), s8(domain), []byte{byte(len(proofs))}, cat(proofs...))
}

// frameSeeds: every post-handshake frame type valid, each at its maximum
// field lengths and one over, malformed payloads, handshake frames, and
// foreign protocols.
func frameSeeds() []namedSeed {
	var seeds []namedSeed
	add := func(name string, b []byte) { seeds = append(seeds, namedSeed{name, b}) }
	for i, m := range sampleMsgs() {
		add(fmt.Sprintf("valid-%02d-%c", i, m.Type), mustMsg(m))
	}
	maxU := MaxFrameLenV4 - 1 - 8 - 2
	// Maximum field lengths.
	add("max-acquire", mustMsg(Msg{Type: TypeAcquire, ID: ^uint64(0), Lease: 250, WaitMs: 300000, Key: rep('k', locksm.MaxKeyLen), Owner: rep('o', locksm.MaxOwnerLen)}))
	add("max-release", mustMsg(Msg{Type: TypeRelease, ID: ^uint64(0), Token: ^uint64(0), Key: rep('~', locksm.MaxKeyLen), Owner: rep('!', locksm.MaxOwnerLen)}))
	add("max-cancel", mustMsg(Msg{Type: TypeCancel, ID: ^uint64(0), Target: ^uint64(0)}))
	add("max-granted", mustMsg(Msg{Type: TypeGranted, ID: ^uint64(0), Token: ^uint64(0)}))
	add("max-moved", mustMsg(Msg{Type: TypeMoved, ID: 1, LeaderAddr: rep('a', 255), LeaderID: rep('i', 255)}))
	add("max-unknown", mustMsg(Msg{Type: TypeUnknown, ID: 1, Text: rep('u', maxU)}))
	add("max-error", mustMsg(Msg{Type: TypeError, ID: 1, Code: Code(0xFFFF), Text: rep('e', MaxTextLen)}))
	add("max-status", mustMsg(Msg{Type: TypeStatusR, ID: ^uint64(0), NodeID: rep('n', 255), Role: RoleShutdown, Term: ^uint64(0),
		LeaderID: rep('l', 255), LeaderAddr: rep('a', 255), Commit: ^uint64(0), Applied: ^uint64(0), LastToken: ^uint64(0), Held: ^uint64(0), Waiting: ^uint64(0)}))
	// Members: as many 255-byte ids and addresses as fit in one frame (7).
	bigMembers := make([]Member, (MaxFrameLenV4-1-8-1)/(1+255+1+1+255))
	for i := range bigMembers {
		bigMembers[i] = Member{ServerID: rep(byte('a'+i), 255), Suffrage: Suffrage(i % 2), ClientAddr: rep('c', 255)}
	}
	add("max-members", mustMsg(Msg{Type: TypeMembersR, ID: ^uint64(0), Members: bigMembers}))
	add("max-notice", mustMsg(Msg{Type: TypeNotice, Event: NoticeHandOver, LeaderID: rep('i', 255), LeaderAddr: rep('a', 255)}))
	// One over: a field the decoder refuses, or a frame above MaxFrameLen.
	add("over-notice-event", rawFrame('N', u64(0), []byte{byte(NoticeServing) + 1}, s8("n1"), s8("")))
	add("max-queued", mustMsg(Msg{Type: TypeQueued, ID: ^uint64(0)}))
	add("bad-queued-id0", rawFrame('Q', u64(0)))
	add("bad-queued-trailing", rawFrame('Q', u64(1), []byte{0}))
	add("bad-queued-short", rawFrame('Q', u32(1)))
	add("over-notice-id", rawFrame('N', u64(1), []byte{byte(NoticeServing)}, s8("n1"), s8("")))
	add("over-members-suffrage", rawFrame('L', u64(7), []byte{1}, s8("n1"), []byte{byte(SuffrageLearner) + 1}, s8("")))
	add("over-members-count", rawFrame('L', u64(7), []byte{3}, s8("n1"), []byte{0}, s8(""), s8("n2"), []byte{1}, s8("")))
	add("over-acquire-owner", rawFrame('a', u64(1), u16(30), u32(0), s8("k"), s8(rep('o', locksm.MaxOwnerLen+1))))
	add("over-release-owner", rawFrame('r', u64(2), u64(1), s8(rep('k', locksm.MaxKeyLen)), s8(rep('o', locksm.MaxOwnerLen+1))))
	add("over-acquire-key-len-past-payload", rawFrame('a', u64(1), u16(30), u32(0), []byte{255}, []byte(rep('k', 254))))
	add("over-moved-str8-past-payload", rawFrame('M', u64(1), []byte{255}, []byte(rep('a', 255)), []byte{1}))
	add("over-unknown-text", rawFrame('U', u64(1), s16(rep('u', maxU+1))))
	add("over-error-text", rawFrame('E', u64(1), u16(1), s16(rep('e', MaxTextLen+1))))
	add("over-status-role", rawFrame('S', u64(6), s8("n1"), []byte{byte(RoleShutdown) + 1}, u64(1), s8(""), s8(""), make([]byte, 40)))
	// Version 5: U and the other types keep the bound of versions 1–4; a
	// frame of up to 8192 bytes is framed, and refused by the decoder.
	add("over-unknown-text-max-frame", rawFrame('U', u64(1), s16(rep('u', MaxFrameLen-1-8-2))))
	add("over-ping-max-frame", rawFrame('p', u64(1), make([]byte, MaxFrameLen-1-8)))
	// Block acquires: 2..16 keys; the count is checked, distinctness and
	// the alphabet are not (locksm's invalid_keys, invalid_key).
	blockKeys := make([]string, locksm.MaxBlockKeys)
	for i := range blockKeys {
		blockKeys[i] = rep(byte('A'+i), locksm.MaxKeyLen)
	}
	add("max-block", mustMsg(Msg{Type: TypeAcquireBlock, ID: ^uint64(0), Lease: 250, WaitMs: 300000, Owner: rep('o', locksm.MaxOwnerLen), Keys: blockKeys}))
	add("min-block", mustMsg(Msg{Type: TypeAcquireBlock, ID: 1, Lease: 1, Owner: "o", Keys: []string{"k", "j"}}))
	add("block-duplicate-keys", mustMsg(Msg{Type: TypeAcquireBlock, ID: 2, Lease: 30, Owner: "o", Keys: []string{"k", "k"}}))
	add("block-key-outside-alphabet", rawFrame('b', u64(3), u16(30), u32(0), s8("o"), []byte{2}, s8("k"), s8("a b")))
	blockHead := cat(u64(4), u16(30), u32(1000), s8("o"))
	add("over-block-17-keys", rawFrame('b', blockHead, []byte{17}, bytes.Repeat(s8(rep('k', locksm.MaxKeyLen)), 17)))
	add("over-block-255-keys", rawFrame('b', blockHead, []byte{255}, bytes.Repeat(s8("k"), 255)))
	add("under-block-1-key", rawFrame('b', blockHead, []byte{1}, s8("k")))
	add("under-block-0-keys", rawFrame('b', blockHead, []byte{0}))
	add("under-block-key-empty", rawFrame('b', blockHead, []byte{2}, s8("k"), s8("")))
	add("under-block-owner-empty", rawFrame('b', u64(4), u16(30), u32(0), s8(""), []byte{2}, s8("k"), s8("j")))
	add("over-block-owner", rawFrame('b', u64(4), u16(30), u32(0), s8(rep('o', locksm.MaxOwnerLen+1)), []byte{2}, s8("k"), s8("j")))
	add("bad-block-keys-short-of-count", rawFrame('b', blockHead, []byte{3}, s8("k"), s8("j")))
	add("bad-block-key-past-payload", rawFrame('b', blockHead, []byte{2}, s8("k"), []byte{255}, []byte("j")))
	add("bad-block-trailing", rawFrame('b', blockHead, []byte{2}, s8("k"), s8("j"), []byte{0}))
	add("bad-block-id0", rawFrame('b', u64(0), u16(30), u32(0), s8("o"), []byte{2}, s8("k"), s8("j")))
	add("over-length-8193", append(binary.BigEndian.AppendUint32(nil, MaxFrameLen+1), 'b'))
	add("over-length-max-u32", []byte{0xff, 0xff, 0xff, 0xff, 'p'})
	// Under and malformed.
	add("under-acquire-key-empty", rawFrame('a', u64(1), u16(30), u32(0), s8(""), s8("o")))
	add("under-acquire-owner-empty", rawFrame('a', u64(1), u16(30), u32(0), s8("k"), s8("")))
	add("bad-ping-id0", rawFrame('p', u64(0)))
	add("bad-ping-trailing", rawFrame('p', u64(1), []byte{0}))
	add("bad-ping-short", rawFrame('p', u32(1)))
	add("bad-cancel-target0", rawFrame('c', u64(1), u64(0)))
	add("bad-error-code0", rawFrame('E', u64(0), u16(0), s16("x")))
	add("bad-granted-id0", rawFrame('G', u64(0), u64(1)))
	add("bad-type-only", []byte{0, 0, 0, 1, 'p'})
	add("bad-length0", []byte{0, 0, 0, 0})
	add("bad-unknown-type", rawFrame('q', u64(1)))
	add("bad-type-nul", rawFrame(0, u64(1)))
	add("truncated-header", []byte{0, 0, 0})
	add("truncated-payload", mustMsg(sampleMsgs()[0])[:20])
	for _, s := range handshakeFrameSeeds() {
		add(s.name, s.data)
	}
	add("foreign-http", seedHTTP)
	add("foreign-tls-clienthello", seedTLS)
	add("foreign-ssh", seedSSH)
	var all []byte
	for i := range sampleMsgs() {
		all = append(all, seeds[i].data...)
	}
	add("stream-all-valid", all)
	return seeds
}

// readerSeeds: FuzzReader inputs, a chunk byte (see chunkParams) then a
// stream: every frame seed alone with rotating read sizes, and streams that
// mix valid frames, decode errors and each way of ending.
func readerSeeds() []namedSeed {
	chunks := []byte{0x00, 0x02, 0x0f, 0x3f, 0x7f, 0x80, 0xc4, 0xff}
	var seeds []namedSeed
	for i, s := range frameSeeds() {
		c := chunks[i%len(chunks)]
		seeds = append(seeds, namedSeed{fmt.Sprintf("%s-c%02x", s.name, c), append([]byte{c}, s.data...)})
	}
	msgs := sampleMsgs()
	var all []byte
	for i := range msgs {
		all = append(all, mustMsg(msgs[i])...)
	}
	ping := mustMsg(Msg{Type: TypePing, ID: 1})
	maxU := mustMsg(Msg{Type: TypeUnknown, ID: 1, Text: rep('u', MaxFrameLenV4-1-8-2)})
	maxE := mustMsg(Msg{Type: TypeError, ID: 0, Code: CodeShuttingDown, Text: rep('e', MaxTextLen)})
	maxKeys := make([]string, locksm.MaxBlockKeys)
	for i := range maxKeys {
		maxKeys[i] = rep(byte('a'+i), locksm.MaxKeyLen)
	}
	maxB := mustMsg(Msg{Type: TypeAcquireBlock, ID: 2, Lease: 30, WaitMs: 1, Owner: rep('o', locksm.MaxOwnerLen), Keys: maxKeys})
	hs := handshakeFrameSeeds()
	mixed := cat(rawFrame('p', u64(0)), ping,
		rawFrame('a', u64(9), u16(30), u32(0), s8("k"), s8(rep('o', locksm.MaxOwnerLen+1))), ping,
		rawFrame('q', u64(1)), hs[0].data, hs[3].data, rawFrame('E', u64(0), u16(0), s16("")), ping)
	streams := []namedSeed{
		{"all-valid", all},
		{"max-frames", cat(maxU, maxE, maxU, ping, maxU, maxE)}, // crosses buffer ends: compaction
		{"max-blocks", cat(maxB, maxU, maxB, ping, maxB, maxB, maxE, maxB)},
		{"decode-errors-then-valid", mixed},
		{"ends-frame-too-large", cat(ping, ping, rawFrame('U', u64(1), s16(rep('u', MaxFrameLen-1-8-2+1))))},
		{"ends-block-too-large", cat(ping, maxB, rawFrame('b', maxB[5:], make([]byte, MaxFrameLen-len(maxB)+5)))},
		{"long-u-then-valid", cat(rawFrame('U', u64(1), s16(rep('u', MaxFrameLenV4))), ping, maxB)}, // framed, refused by the decoder
		{"ends-length0", cat(ping, []byte{0, 0, 0, 0}, ping)},
		{"ends-truncated-frame", cat(ping, all[:len(all)-3])},
		{"ends-truncated-header", cat(ping, []byte{0, 0})},
		{"http", seedHTTP},
		{"tls-clienthello", seedTLS},
		{"empty", nil},
	}
	for _, s := range streams {
		for _, c := range []byte{0x00, 0x06, 0x41, 0xc4, 0xff} {
			seeds = append(seeds, namedSeed{fmt.Sprintf("rs-%s-c%02x", s.name, c), append([]byte{c}, s.data...)})
		}
	}
	return seeds
}

// serverHandshakeSeeds: client byte streams for FuzzHandshake's servers
// (fuzzServerCfgs: the client port, kind client, secret clientSecret,
// cluster "prod", node "n1", without a fencing domain [0] and in domain
// "d1" [2]; and the peer port [1]; zero server nonce).
func serverHandshakeSeeds() []namedSeed {
	cn := bytes.Repeat([]byte{7}, 32)
	sn := make([]byte, 32)
	v := uint16(ProtocolVersion)
	auth := func(sender, expect string) []byte {
		tr := specTranscript(v, KindClient, cn, sn, "prod", "n1", sender, expect, "", "", nil)
		return rawFrame('x', specProof(clientSecret, specClientLabel, tr))
	}
	hello := specHelloFrame(v, v, KindClient, cn, "prod", "", "", "")
	good := auth("", "")
	authV := func(version uint16) []byte {
		tr := specTranscript(version, KindClient, cn, sn, "prod", "n1", "", "", "", "", nil)
		return rawFrame('x', specProof(clientSecret, specClientLabel, tr))
	}
	serverProof := specProof(clientSecret, specServerLabel, specTranscript(v, KindClient, cn, sn, "prod", "n1", "", "", "", "", nil))
	ping := mustMsg(Msg{Type: TypePing, ID: 1})
	// Fencing domains on the client port: the Hello names helloDomain, the
	// server answers with serverDomain ("" for cfgs[0], "d1" for cfgs[2]);
	// both are in the transcript.
	helloD := func(domain string) []byte { return specHelloFrame(v, v, KindClient, cn, "prod", "", "", domain) }
	authD := func(helloDomain, serverDomain string) []byte {
		tr := specTranscript(v, KindClient, cn, sn, "prod", "n1", "", "", helloDomain, serverDomain, nil)
		return rawFrame('x', specProof(clientSecret, specClientLabel, tr))
	}
	maxDomain := rep('d', 255)
	seeds := []namedSeed{
		{"valid", cat(hello, good)},
		{"valid-then-traffic", cat(hello, good, ping, ping)},
		{"valid-wide-versions", cat(specHelloFrame(1, 0xffff, KindClient, cn, "prod", "", "", ""), good)},
		// Older clients negotiate their own version (and get the Welcome
		// of that version: empty, without the limits).
		{"valid-v4-client", cat(specHelloFrame(2, 4, KindClient, cn, "prod", "", "", ""), authV(4))},
		{"valid-v3-client", cat(specHelloFrame(2, 3, KindClient, cn, "prod", "", "", ""), authV(3))},
		{"valid-v2-client", cat(specHelloFrame(2, 2, KindClient, cn, "prod", "", "", ""), authV(2))},
		{"v3-client-proof-for-newest", cat(specHelloFrame(2, 3, KindClient, cn, "prod", "", "", ""), good)},
		{"v4-client-proof-for-newest", cat(specHelloFrame(2, 4, KindClient, cn, "prod", "", "", ""), good)},
		{"valid-max-sender-expect-n1", cat(specHelloFrame(v, v, KindClient, cn, "prod", rep('s', 255), "n1", ""), auth(rep('s', 255), "n1"))},
		{"valid-rollover-next-secret-refused", cat(hello, rawFrame('x', specProof(nextPeerSecret, specClientLabel,
			specTranscript(v, KindClient, cn, sn, "prod", "n1", "", "", "", "", nil))))},
		{"hello-only", hello},
		{"hello-max-cluster", cat(specHelloFrame(v, v, KindClient, cn, rep('c', 255), "", "", ""), good)},
		{"hello-max-expect", cat(specHelloFrame(v, v, KindClient, cn, "prod", "", rep('e', 255), ""), good)},
		{"hello-wrong-magic", cat(rawFrame('h', []byte("TKTH"), hello[9:]), good)},
		{"hello-trailing-byte", cat(rawFrame('h', hello[5:], []byte{0}), good)},
		{"hello-str8-past-payload", rawFrame('h', hello[5:len(hello)-1], []byte{255})},
		{"hello-version-1", cat(specHelloFrame(1, 1, KindClient, cn, "prod", "", "", ""), good)},
		{"hello-version-3-5", cat(specHelloFrame(3, 5, KindClient, cn, "prod", "", "", ""), good)},
		{"hello-min-gt-max", cat(specHelloFrame(v+1, v, KindClient, cn, "prod", "", "", ""), good)},
		{"hello-kind-peer", cat(specHelloFrame(v, v, KindPeer, cn, "prod", "n2", "n1", ""), good)},
		{"hello-kind-0", cat(specHelloFrame(v, v, 0, cn, "prod", "", "", ""), good)},
		{"hello-wrong-cluster", cat(specHelloFrame(v, v, KindClient, cn, "staging", "", "", ""), good)},
		{"hello-wrong-expect", cat(specHelloFrame(v, v, KindClient, cn, "prod", "", "n9", ""), good)},
		// Fencing domain: "" on either side matches any; two named domains
		// must be equal (else wrong_domain, checked after the cluster id and
		// before expect_id).
		{"hello-domain-match", cat(helloD("d1"), authD("d1", "d1"))},                        // ok on cfgs[2]
		{"hello-domain-wrong", cat(helloD("d2"), authD("d2", "d1"))},                        // wrong_domain on cfgs[2]
		{"hello-domain-empty-server-has-one", cat(hello, authD("", "d1"))},                  // ok on cfgs[2]
		{"hello-domain-any-server-has-none", cat(helloD("d2"), authD("d2", ""))},            // ok on cfgs[0]
		{"hello-max-domain", cat(helloD(maxDomain), authD(maxDomain, ""))},                  // ok on cfgs[0]
		{"hello-max-domain-server-has-one", cat(helloD(maxDomain), authD(maxDomain, "d1"))}, // wrong_domain on cfgs[2]
		{"hello-domain-wrong-and-wrong-expect", cat(specHelloFrame(v, v, KindClient, cn, "prod", "", "n9", "d2"), authD("d2", "d1"))},
		{"hello-domain-wrong-and-wrong-cluster", cat(specHelloFrame(v, v, KindClient, cn, "staging", "", "", "d2"), authD("d2", "d1"))},
		// A man in the middle strips the dialler's domain "d2" so that the
		// "d1" server accepts: the proof covers the domain, so it fails.
		{"hello-domain-stripped", cat(hello, authD("d2", "d1"))},
		// The Hello of a build before the domain field: one str8 short.
		{"hello-without-domain", cat(rawFrame('h', hello[5:len(hello)-1]), good)},
		// A version 1 client: its Hello has the version 1 layout (no domain
		// field), and it is told "version", not "malformed".
		{"hello-v1-layout", cat(rawFrame('h', []byte("TKTG"), u16(1), u16(1), []byte{byte(KindClient)}, cn, s8("prod"), s8(""), s8("")), good)},
		{"hello-version-only", rawFrame('h', []byte("TKTG"), u16(1), u16(1))},
		{"hello-version-cut", rawFrame('h', []byte("TKTG"), u16(1), []byte{0})},
		{"hello-over-length", cat(rawFrame('h', hello[5:], make([]byte, MaxFrameLen)))},
		{"auth-wrong-proof", cat(hello, rawFrame('x', make([]byte, 32)))},
		{"auth-reflected-server-proof", cat(hello, rawFrame('x', serverProof))},
		{"auth-truncated", cat(hello, good[:len(good)-1])},
		{"auth-short-payload", cat(hello, rawFrame('x', good[5:len(good)-1]))},
		{"auth-long-payload", cat(hello, rawFrame('x', good[5:], []byte{0}))},
		{"auth-empty", cat(hello, []byte{0, 0, 0, 1, 'x'})},
		{"auth-length0", cat(hello, []byte{0, 0, 0, 0})},
		{"auth-too-large", cat(hello, []byte{0, 0, 0x20, 0x01, 'x'})},
		{"auth-over-v4-bound", cat(hello, rawFrame('x', good[5:], make([]byte, MaxFrameLenV4)))},
		{"error-after-hello", cat(hello, mustMsg(Msg{Type: TypeError, Code: CodeAuthFailed, Text: "no"}))},
		{"welcome-after-hello", cat(hello, specWelcome)},
		{"challenge-reflected", cat(hello, specChallengeFrame(v, sn, "n1", "prod", "", serverProof))},
		{"ping-after-hello", cat(hello, ping)},
		{"first-ping", ping},
		{"first-auth", good},
		{"first-error", mustMsg(Msg{Type: TypeError, Code: CodeVersion, Text: "x"})},
		{"first-welcome", specWelcome},
		{"length0", []byte{0, 0, 0, 0}},
		{"length-8193", append(binary.BigEndian.AppendUint32(nil, MaxFrameLen+1), 'h')},
		{"hello-over-v4-bound", cat(rawFrame('h', hello[5:], make([]byte, MaxFrameLenV4)), good)},
		{"truncated-hello", hello[:len(hello)-5]},
		{"truncated-header", hello[:3]},
		{"foreign-http", seedHTTP},
		{"foreign-tls-clienthello", seedTLS},
		{"foreign-ssh", seedSSH},
		{"empty", nil},
	}
	// Peer port (fuzzServerCfgs()[1]: n1/abcdefghij, name n1, secrets
	// peerSecret and nextPeerSecret): peers, discovery, rollover.
	peerAuth := func(kind ConnKind, sender, expect string, secret []byte) []byte {
		tr := specTranscript(v, kind, cn, sn, "prod", "n1/abcdefghij", sender, expect, "", "", nil)
		return rawFrame('x', specProof(secret, specClientLabel, tr))
	}
	peerHello := func(kind ConnKind, expect string) []byte {
		return specHelloFrame(v, v, kind, cn, "prod", "n2/zzzzzzzzzz", expect, "")
	}
	// A dialling peer that names its domain to a server without one.
	peerDomainTr := specTranscript(v, KindPeer, cn, sn, "prod", "n1/abcdefghij", "n2/zzzzzzzzzz", "n1/abcdefghij", "d1", "", nil)
	seeds = append(seeds,
		namedSeed{"peer-valid", cat(peerHello(KindPeer, "n1/abcdefghij"), peerAuth(KindPeer, "n2/zzzzzzzzzz", "n1/abcdefghij", peerSecret))},
		namedSeed{"peer-valid-next-secret", cat(peerHello(KindPeer, "n1/abcdefghij"), peerAuth(KindPeer, "n2/zzzzzzzzzz", "n1/abcdefghij", nextPeerSecret))},
		namedSeed{"peer-stranger-secret", cat(peerHello(KindPeer, "n1/abcdefghij"), peerAuth(KindPeer, "n2/zzzzzzzzzz", "n1/abcdefghij", strangerSecret))},
		namedSeed{"peer-expects-bare-name", cat(peerHello(KindPeer, "n1"), peerAuth(KindPeer, "n2/zzzzzzzzzz", "n1", peerSecret))},
		namedSeed{"peer-expects-nobody", cat(peerHello(KindPeer, ""), peerAuth(KindPeer, "n2/zzzzzzzzzz", "", peerSecret))},
		namedSeed{"discover-bare-name", cat(peerHello(KindDiscover, "n1"), peerAuth(KindDiscover, "n2/zzzzzzzzzz", "n1", peerSecret))},
		namedSeed{"discover-full-id", cat(peerHello(KindDiscover, "n1/abcdefghij"), peerAuth(KindDiscover, "n2/zzzzzzzzzz", "n1/abcdefghij", nextPeerSecret))},
		namedSeed{"discover-other-name", cat(peerHello(KindDiscover, "n9"), peerAuth(KindDiscover, "n2/zzzzzzzzzz", "n9", peerSecret))},
		namedSeed{"discover-name-prefix", cat(peerHello(KindDiscover, "n1/"), peerAuth(KindDiscover, "n2/zzzzzzzzzz", "n1/", peerSecret))},
		namedSeed{"admin-kind-on-peer-port", cat(peerHello(KindAdmin, "n1/abcdefghij"), peerAuth(KindAdmin, "n2/zzzzzzzzzz", "n1/abcdefghij", peerSecret))},
		namedSeed{"peer-with-domain", cat(specHelloFrame(v, v, KindPeer, cn, "prod", "n2/zzzzzzzzzz", "n1/abcdefghij", "d1"),
			rawFrame('x', specProof(peerSecret, specClientLabel, peerDomainTr)))},
		namedSeed{"peer-auth-with-client-kind-transcript", cat(peerHello(KindPeer, "n1/abcdefghij"), peerAuth(KindDiscover, "n2/zzzzzzzzzz", "n1/abcdefghij", peerSecret))},
	)
	return seeds
}

// clientHandshakeSeeds: server byte streams for FuzzClientHandshake (see
// fuzzClientCfgs; zero client nonce). The dialler's own domain ("" for
// cfgs[0..2], "d1" for cfgs[3]) is in the transcript as hello_domain, so a
// proof is valid for one of the two client-kind configs only.
func clientHandshakeSeeds() []namedSeed {
	cn := make([]byte, 32)
	sn := bytes.Repeat([]byte{0x5a}, 32)
	v := uint16(ProtocolVersion)
	// Client dialler: kind client, no sender id, any node.
	trC := func(version uint16, serverID, clusterID string) []byte {
		return specTranscript(version, KindClient, cn, sn, clusterID, serverID, "", "", "", "", nil)
	}
	pC := func(version uint16, serverID, clusterID string) []byte {
		return specProof(clientSecret, specServerLabel, trC(version, serverID, clusterID))
	}
	// Peer dialler: n2 expecting n1, secrets peerSecret and nextPeerSecret.
	trP := func(serverID string) []byte {
		return specTranscript(v, KindPeer, cn, sn, "prod", serverID, "n2", "n1", "", "", nil)
	}
	// Discovering dialler: n2/zzzzzzzzzz expecting the bare name n1.
	trD := func(serverID string) []byte {
		return specTranscript(v, KindDiscover, cn, sn, "prod", serverID, "n2/zzzzzzzzzz", "n1", "", "", nil)
	}
	valid := specChallengeFrame(v, sn, "n1", "prod", "", pC(v, "n1", "prod"))
	wrong := bytes.Repeat([]byte{0xee}, 32)
	ping := mustMsg(Msg{Type: TypePing, ID: 1})
	eFrame := mustMsg(Msg{Type: TypeError, Code: CodeAuthFailed, Text: "client proof does not match"})
	// Fencing domains: a Challenge from n1 naming chDomain, proven for a
	// client-kind dialler whose Hello named helloDomain.
	pD := func(helloDomain, chDomain string) []byte {
		return specProof(clientSecret, specServerLabel, specTranscript(v, KindClient, cn, sn, "prod", "n1", "", "", helloDomain, chDomain, nil))
	}
	chD := func(chDomain string, proofs ...[]byte) []byte {
		return specChallengeFrame(v, sn, "n1", "prod", chDomain, proofs...)
	}
	maxDomain := rep('d', 255)
	wel := specWelcome4(4096, 200000)
	return []namedSeed{
		{"valid", cat(valid, wel)},
		{"valid-then-traffic", cat(valid, wel, ping)},
		{"valid-max-server-id", cat(specChallengeFrame(v, sn, rep('n', 255), "prod", "", pC(v, rep('n', 255), "prod")), wel)},
		{"two-proofs-second-valid", cat(specChallengeFrame(v, sn, "n1", "prod", "", wrong, pC(v, "n1", "prod")), wel)},
		{"two-proofs-first-valid", cat(specChallengeFrame(v, sn, "n1", "prod", "", pC(v, "n1", "prod"), wrong), wel)},
		{"two-proofs-both-wrong", cat(specChallengeFrame(v, sn, "n1", "prod", "", wrong, wrong), wel)},
		{"peer-valid-current-secret", cat(specChallengeFrame(v, sn, "n1", "prod", "", specProof(peerSecret, specServerLabel, trP("n1"))), wel)},
		{"peer-rollover-next-secret", cat(specChallengeFrame(v, sn, "n1", "prod", "",
			specProof(strangerSecret, specServerLabel, trP("n1")), specProof(nextPeerSecret, specServerLabel, trP("n1"))), wel)},
		{"peer-rollover-both", cat(specChallengeFrame(v, sn, "n1", "prod", "",
			specProof(nextPeerSecret, specServerLabel, trP("n1")), specProof(peerSecret, specServerLabel, trP("n1"))), wel)},
		{"peer-wrong-node-name-prefix", cat(specChallengeFrame(v, sn, "n1/abcdefghij", "prod", "", specProof(peerSecret, specServerLabel, trP("n1/abcdefghij"))), wel)},
		{"peer-wrong-node-valid-proof", cat(specChallengeFrame(v, sn, "n3", "prod", "", specProof(peerSecret, specServerLabel, trP("n3"))), wel)},
		{"discover-full-id", cat(specChallengeFrame(v, sn, "n1/abcdefghij", "prod", "", specProof(peerSecret, specServerLabel, trD("n1/abcdefghij"))), wel)},
		{"discover-bare-name", cat(specChallengeFrame(v, sn, "n1", "prod", "", specProof(peerSecret, specServerLabel, trD("n1"))), wel)},
		{"discover-other-name", cat(specChallengeFrame(v, sn, "n10/abcdefghij", "prod", "", specProof(peerSecret, specServerLabel, trD("n10/abcdefghij"))), wel)},
		{"discover-name-slash-only", cat(specChallengeFrame(v, sn, "n1/", "prod", "", specProof(peerSecret, specServerLabel, trD("n1/"))), wel)},
		{"wrong-proof", cat(specChallengeFrame(v, sn, "n1", "prod", "", wrong), wel)},
		{"reflected-client-label", cat(specChallengeFrame(v, sn, "n1", "prod", "",
			specProof(clientSecret, specClientLabel, trC(v, "n1", "prod"))), wel)},
		{"proof-for-other-nonce", cat(specChallengeFrame(v, bytes.Repeat([]byte{0x5b}, 32), "n1", "prod", "", pC(v, "n1", "prod")), wel)},
		{"n0", cat(specChallengeFrame(v, sn, "n1", "prod", ""), wel)},
		{"n3", cat(specChallengeFrame(v, sn, "n1", "prod", "", pC(v, "n1", "prod"), pC(v, "n1", "prod"), pC(v, "n1", "prod")), wel)},
		{"n2-one-proof", cat(rawFrame('C', valid[5:len(valid)-33], []byte{2}, valid[len(valid)-32:]), wel)},
		{"n1-trailing-byte", cat(rawFrame('C', valid[5:], []byte{0}), wel)},
		{"n255", cat(rawFrame('C', valid[5:len(valid)-33], []byte{255}, bytes.Repeat(valid[len(valid)-32:], 8)), wel)},
		{"version-1", cat(specChallengeFrame(1, sn, "n1", "prod", "", pC(1, "n1", "prod")), wel)},
		{"version-3", cat(specChallengeFrame(3, sn, "n1", "prod", "", pC(3, "n1", "prod")), specWelcome)},
		{"version-2", cat(specChallengeFrame(2, sn, "n1", "prod", "", pC(2, "n1", "prod")), specWelcome)},
		{"version-3-welcome-with-limits", cat(specChallengeFrame(3, sn, "n1", "prod", "", pC(3, "n1", "prod")), wel)},
		{"version-4", cat(specChallengeFrame(4, sn, "n1", "prod", "", pC(4, "n1", "prod")), wel)},
		{"version-above-newest", cat(specChallengeFrame(ProtocolVersion+1, sn, "n1", "prod", "", pC(ProtocolVersion+1, "n1", "prod")), wel)},
		{"wrong-cluster", cat(specChallengeFrame(v, sn, "n1", "staging", "", pC(v, "n1", "staging")), wel)},
		// Fencing domain: cfgs[3] expects "d1"; cfgs[0] accepts any and
		// learns the server's.
		{"domain-match", cat(chD("d1", pD("d1", "d1")), wel)},                            // ok on cfgs[3]
		{"domain-wrong", cat(chD("d2", pD("d1", "d2")), wel)},                            // wrong_domain on cfgs[3]
		{"domain-wrong-unproven", cat(chD("d2", wrong), wel)},                            // wrong_domain before auth_failed
		{"domain-empty-client-expects-one", cat(chD("", pD("d1", "")), wel)},             // ok on cfgs[3]
		{"domain-any-client-expects-none", cat(chD("d7", pD("", "d7")), wel)},            // ok on cfgs[0]
		{"max-domain", cat(chD(maxDomain, pD("", maxDomain)), wel)},                      // ok on cfgs[0]
		{"max-domain-client-expects-one", cat(chD(maxDomain, pD("d1", maxDomain)), wel)}, // wrong_domain on cfgs[3]
		{"domain-wrong-and-wrong-cluster", cat(specChallengeFrame(v, sn, "n1", "staging", "d2", pC(v, "n1", "staging")), wel)},
		// A man in the middle strips the server's domain "d2" so that the
		// "d1" client would accept: the proof covers it, so it fails.
		{"domain-stripped", cat(chD("", pD("d1", "d2")), wel)},
		// The Challenge of a build before the domain field.
		{"challenge-without-domain", cat(rawFrame('C', u16(v), sn, s8("n1"), s8("prod"), []byte{1}, pC(v, "n1", "prod")), wel)},
		{"domain-n0", cat(chD("d1"), wel)},
		{"max-cluster", cat(specChallengeFrame(v, sn, "n1", rep('c', 255), "", pC(v, "n1", rep('c', 255))), wel)},
		{"challenge-over-length", cat(rawFrame('C', valid[5:], make([]byte, MaxFrameLen)), wel)},
		{"truncated-challenge", valid[:len(valid)-1]},
		{"truncated-header", valid[:2]},
		{"challenge-only", valid},
		{"truncated-welcome", cat(valid, specWelcome[:3])},
		{"welcome-with-payload", cat(valid, rawFrame('W', []byte{0}))},
		// Version 4: the Welcome is exactly max_in_flight u32 | max_waiters u32.
		{"welcome-v4-empty", cat(valid, specWelcome)},
		{"welcome-v4-short", cat(valid, wel[:len(wel)-1])},
		{"welcome-v4-7-bytes", cat(valid, rawFrame('W', make([]byte, 7)))},
		{"welcome-v4-9-bytes", cat(valid, rawFrame('W', make([]byte, 9)))},
		{"welcome-v4-zero-limits", cat(valid, specWelcome4(0, 0))},
		{"welcome-v4-max-limits", cat(valid, specWelcome4(^uint32(0), ^uint32(0)))},
		{"welcome-length0", cat(valid, []byte{0, 0, 0, 0})},
		{"welcome-too-large", cat(valid, []byte{0, 0, 0x20, 0x01, 'W'})},
		{"welcome-over-v4-bound", cat(valid, rawFrame('W', make([]byte, MaxFrameLenV4)))},
		{"challenge-twice", cat(valid, valid)},
		{"ping-instead-of-welcome", cat(valid, ping)},
		{"error-after-challenge", cat(valid, eFrame)},
		{"error", eFrame},
		{"error-version", mustMsg(Msg{Type: TypeError, Code: CodeVersion, Text: "no common version"})},
		{"error-unknown-code", mustMsg(Msg{Type: TypeError, Code: 999, Text: "from the future"})},
		{"error-malformed", rawFrame('E', u64(0), u16(0), s16(""))},
		{"welcome-first", specWelcome},
		{"hello-reflected", specHelloFrame(v, v, KindClient, cn, "prod", "", "", "")},
		{"ping-first", ping},
		{"length0", []byte{0, 0, 0, 0}},
		{"foreign-http-response", seedHTTPResponse},
		{"foreign-http-request", seedHTTP},
		{"foreign-tls-clienthello", seedTLS},
		{"foreign-ssh", seedSSH},
		{"empty", nil},
	}
}

// marshalSeed is Go's corpus file format for one []byte argument.
func marshalSeed(b []byte) []byte {
	return fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", b)
}

// TestWriteFuzzSeedCorpus writes the named seeds as corpus files (with
// -wire.writecorpus). Without the flag it only checks that the seed names
// are unique, so no seed silently overwrites another.
func TestWriteFuzzSeedCorpus(t *testing.T) {
	targets := map[string][]namedSeed{
		"FuzzSplitDecode":     frameSeeds(),
		"FuzzReader":          readerSeeds(),
		"FuzzHandshake":       serverHandshakeSeeds(),
		"FuzzClientHandshake": clientHandshakeSeeds(),
	}
	for target, seeds := range targets {
		seen := map[string]bool{}
		for _, s := range seeds {
			if seen[s.name] {
				t.Fatalf("%s: duplicate seed name %q", target, s.name)
			}
			seen[s.name] = true
		}
		if !*writeCorpus {
			continue
		}
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range seeds {
			if err := os.WriteFile(filepath.Join(dir, "seed-"+s.name), marshalSeed(s.data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// Seeds renamed or gone leave no stale file behind (findings the
		// fuzzer saved have hash names and stay).
		old, err := filepath.Glob(filepath.Join(dir, "seed-*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range old {
			if name := strings.TrimPrefix(filepath.Base(f), "seed-"); !seen[name] {
				if err := os.Remove(f); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func seedByName(t *testing.T, seeds []namedSeed, name string) []byte {
	t.Helper()
	for _, s := range seeds {
		if s.name == name {
			return s.data
		}
	}
	t.Fatalf("no seed %q", name)
	return nil
}

// TestFuzzSeedsSucceed guards the handshake targets against going vacuous:
// the seeds built to succeed do succeed (so the fuzzer starts from inputs
// that reach the end of the handshake), under the configs the targets use.
func TestFuzzSeedsSucceed(t *testing.T) {
	byName := func(seeds []namedSeed, name string) []byte { return seedByName(t, seeds, name) }
	cfgs := fuzzClientCfgs()
	for _, tc := range []struct {
		seed string
		cfg  int
	}{
		{"valid", 0}, {"valid-then-traffic", 0}, {"valid-max-server-id", 0},
		{"two-proofs-second-valid", 0}, {"two-proofs-first-valid", 0},
		{"peer-valid-current-secret", 1}, {"peer-rollover-next-secret", 1}, {"peer-rollover-both", 1},
		{"discover-full-id", 2}, {"discover-bare-name", 2},
		{"domain-any-client-expects-none", 0}, {"max-domain", 0},
		{"domain-match", 3}, {"domain-empty-client-expects-one", 3},
		{"version-4", 0}, {"version-3", 0}, {"version-2", 0}, {"welcome-v4-zero-limits", 0}, {"welcome-v4-max-limits", 0},
	} {
		data := byName(clientHandshakeSeeds(), tc.seed)
		if _, err := ClientHandshake(newFuzzRW(data), cfgs[tc.cfg]); err != nil {
			t.Errorf("client seed %s: %v", tc.seed, err)
		}
		if w := wantClient(cfgs[tc.cfg], data); w.err != nil {
			t.Errorf("client seed %s: reference says %v", tc.seed, w.err)
		}
	}
	scfgs := fuzzServerCfgs()
	for _, tc := range []struct {
		seed string
		cfg  int
	}{
		{"valid", 0}, {"valid-then-traffic", 0}, {"valid-wide-versions", 0}, {"valid-max-sender-expect-n1", 0},
		{"peer-valid", 1}, {"peer-valid-next-secret", 1}, {"discover-bare-name", 1}, {"discover-full-id", 1},
		{"hello-domain-any-server-has-none", 0}, {"hello-max-domain", 0}, {"peer-with-domain", 1},
		{"hello-domain-match", 2}, {"hello-domain-empty-server-has-one", 2},
		{"valid-v4-client", 0}, {"valid-v3-client", 0}, {"valid-v2-client", 0},
	} {
		data := byName(serverHandshakeSeeds(), tc.seed)
		if _, err := ServerHandshake(newFuzzRW(data), scfgs[tc.cfg]); err != nil {
			t.Errorf("server seed %s: %v", tc.seed, err)
		}
		if w := wantServer(scfgs[tc.cfg], data); w.err != nil {
			t.Errorf("server seed %s: reference says %v", tc.seed, w.err)
		}
	}
}

// TestFuzzSeedsRefused: the seeds built to stop at one particular check
// (the fencing domain ones, whose order among the checks matters) stop
// there, in the implementation and in the reference alike.
func TestFuzzSeedsRefused(t *testing.T) {
	cfgs := fuzzClientCfgs()
	for _, tc := range []struct {
		seed string
		cfg  int
		want error
	}{
		{"domain-wrong", 3, ErrWrongDomain},
		{"domain-wrong", 0, ErrAuthFailed}, // proven for a dialler naming "d1"
		{"domain-wrong-unproven", 3, ErrWrongDomain},
		{"domain-wrong-unproven", 0, ErrAuthFailed},
		{"max-domain-client-expects-one", 3, ErrWrongDomain},
		{"max-domain", 3, ErrWrongDomain},
		{"domain-any-client-expects-none", 3, ErrWrongDomain},
		{"domain-match", 0, ErrAuthFailed},
		{"domain-wrong-and-wrong-cluster", 3, ErrWrongCluster},
		{"domain-stripped", 3, ErrAuthFailed},
		{"challenge-without-domain", 0, ErrMalformed},
		{"domain-n0", 3, ErrMalformed},
		{"version-3-welcome-with-limits", 0, ErrMalformed},
		{"version-above-newest", 0, ErrVersion},
		{"welcome-v4-empty", 0, ErrMalformed},
		{"welcome-v4-7-bytes", 0, ErrMalformed},
		{"welcome-v4-9-bytes", 0, ErrMalformed},
	} {
		data := seedByName(t, clientHandshakeSeeds(), tc.seed)
		rw := newFuzzRW(data)
		_, err := ClientHandshake(rw, cfgs[tc.cfg])
		if !errors.Is(err, tc.want) {
			t.Errorf("client seed %s, cfg %d: %v, want %v", tc.seed, tc.cfg, err, tc.want)
		}
		if w := wantClient(cfgs[tc.cfg], data); !errors.Is(w.err, tc.want) {
			t.Errorf("client seed %s, cfg %d: reference says %v, want %v", tc.seed, tc.cfg, w.err, tc.want)
		}
		// The client refuses a wrong domain before it proves anything:
		// it writes its Hello and one E frame.
		if out, _ := specFrames(rw.w.Bytes()); tc.want == ErrWrongDomain && (len(out) != 2 || out[1].typ != TypeError) {
			t.Errorf("client seed %s, cfg %d: wrote % x", tc.seed, tc.cfg, rw.w.Bytes())
		}
	}
	scfgs := fuzzServerCfgs()
	for _, tc := range []struct {
		seed string
		cfg  int
		want error
	}{
		{"hello-domain-wrong", 2, ErrWrongDomain},
		{"hello-domain-wrong", 0, ErrAuthFailed}, // proven for a "d1" server
		{"hello-max-domain-server-has-one", 2, ErrWrongDomain},
		{"hello-max-domain", 2, ErrWrongDomain},
		{"hello-domain-any-server-has-none", 2, ErrWrongDomain},
		{"hello-domain-match", 0, ErrAuthFailed},
		{"hello-domain-wrong-and-wrong-expect", 2, ErrWrongDomain},
		{"hello-domain-wrong-and-wrong-expect", 0, ErrWrongNode},
		{"hello-domain-wrong-and-wrong-cluster", 2, ErrWrongCluster},
		{"hello-domain-stripped", 2, ErrAuthFailed},
		{"hello-without-domain", 0, ErrMalformed},
		{"hello-v1-layout", 0, ErrVersion},
		{"hello-version-only", 0, ErrVersion},
		{"hello-version-cut", 0, ErrMalformed},
		{"v3-client-proof-for-newest", 0, ErrAuthFailed}, // the version is in the transcript
		{"v4-client-proof-for-newest", 0, ErrAuthFailed},
	} {
		data := seedByName(t, serverHandshakeSeeds(), tc.seed)
		rw := newFuzzRW(data)
		_, err := ServerHandshake(rw, scfgs[tc.cfg])
		if !errors.Is(err, tc.want) {
			t.Errorf("server seed %s, cfg %d: %v, want %v", tc.seed, tc.cfg, err, tc.want)
		}
		if w := wantServer(scfgs[tc.cfg], data); !errors.Is(w.err, tc.want) {
			t.Errorf("server seed %s, cfg %d: reference says %v, want %v", tc.seed, tc.cfg, w.err, tc.want)
		}
		// A wrong domain is refused before the Challenge: one E frame.
		if out, _ := specFrames(rw.w.Bytes()); tc.want == ErrWrongDomain && (len(out) != 1 || out[0].typ != TypeError) {
			t.Errorf("server seed %s, cfg %d: wrote % x", tc.seed, tc.cfg, rw.w.Bytes())
		}
	}
}
