package wire

import (
	"bytes"
	"errors"
	"io"
	"math"
	"reflect"
	"testing"

	"ticketing/locksm"
)

// Fuzz targets of the client protocol decoder and the handshake. Their seed
// corpora live in testdata/fuzz/<FuzzName>/ (written by
// TestWriteFuzzSeedCorpus, fuzz_seeds_test.go, which also holds the
// protocol-level reference parsers the targets check against). Run one with
//
//	go test ./cluster/wire -run '^$' -fuzz '^FuzzReader$' -fuzztime 10m -parallel 1

// FuzzSplitDecode: arbitrary bytes never panic the parser, and every frame
// that decodes re-encodes to exactly the same bytes (the encoding is
// canonical) and decodes to the same message.
func FuzzSplitDecode(f *testing.F) {
	msgs := sampleMsgs()
	var all []byte
	for i := range msgs {
		b, _ := AppendMsg(nil, &msgs[i])
		f.Add(b)
		all = append(all, b...)
	}
	f.Add(all)
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Add([]byte{0, 0, 0, 9, 'p', 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		rest := data
		for {
			typ, payload, n, err := SplitFrame(rest)
			if err != nil || n == 0 {
				return
			}
			frame := rest[:n]
			rest = rest[n:]
			var m Msg
			if DecodeMsg(typ, payload, &m) != nil {
				continue
			}
			enc, err := AppendMsg(nil, &m)
			if err != nil {
				t.Fatalf("decoded %+v does not encode: %v", m, err)
			}
			if !bytes.Equal(enc, frame) {
				t.Fatalf("re-encoding differs:\n in % x\nout % x", frame, enc)
			}
			var m2 Msg
			if err := DecodeMsg(enc[4], enc[5:], &m2); err != nil || !reflect.DeepEqual(m2, m) {
				t.Fatalf("second decode: %+v %v", m2, err)
			}
		}
	})
}

// zeroRand makes the server nonce predictable so the seed corpus can hold a
// handshake that succeeds.
type zeroRand struct{}

func (zeroRand) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// fuzzRW feeds a handshake the fuzz input, records what the handshake
// writes, and notes a Read after the input reported io.EOF (on a real
// connection that would be a read blocking beyond what the peer sent).
type fuzzRW struct {
	r            *bytes.Reader
	w            bytes.Buffer
	eof          bool
	readAfterEOF bool
}

func newFuzzRW(data []byte) *fuzzRW { return &fuzzRW{r: bytes.NewReader(data)} }

func (rw *fuzzRW) Read(p []byte) (int, error) {
	if rw.eof {
		rw.readAfterEOF = true
	}
	n, err := rw.r.Read(p)
	if err == io.EOF {
		rw.eof = true
	}
	return n, err
}

func (rw *fuzzRW) Write(p []byte) (int, error) { return rw.w.Write(p) }

// consumed is how many input bytes the handshake read.
func (rw *fuzzRW) consumed() int { return int(rw.r.Size()) - rw.r.Len() }

// handshakeErrs is every error class a handshake may return for hostile
// input: the sentinels of every wire code (a code the other side sent, or a
// check that failed), ErrRemote for unknown codes, and end of input.
func handshakeErrs() []error {
	errs := []error{ErrRemote, io.EOF, io.ErrUnexpectedEOF}
	for _, e := range codeTable {
		errs = append(errs, e.err)
	}
	return errs
}

func isAny(err error, targets ...error) bool {
	for _, e := range targets {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// FuzzHandshake: a server (client port, and peer port in a secret rollover)
// fed arbitrary client bytes never panics, succeeds only on a correct
// proof, reads exactly the two handshake frames, and
// writes exactly Challenge then Welcome when it succeeds (or a Challenge
// and/or one connection-level E frame when it fails). Every outcome is
// compared with wantServer, a reading of PROTOCOL.md that shares no code
// with the handshake.
func FuzzHandshake(f *testing.F) {
	// A valid Hello and the matching Auth for a zero server nonce
	// (fuzzServerCfgs()[0]: client port, node n1).
	hello := []byte{0, 0, 0, 0, TypeHello}
	hello = append(hello, Magic...)
	hello = append(hello, 0, ProtocolVersion, 0, ProtocolVersion, byte(KindClient))
	cn := bytes.Repeat([]byte{7}, NonceLen)
	hello = append(hello, cn...)
	hello = append(hello, 4, 'p', 'r', 'o', 'd', 0, 0, 0) // cluster, sender, expect, domain
	hello = finishFrame(hello)
	var sn [NonceLen]byte
	t := transcript(ProtocolVersion, KindClient, cn, sn[:], "prod", "n1", "", "", "", "", nil)
	auth := finishFrame(append([]byte{0, 0, 0, 0, TypeAuth}, proof(clientSecret, clientLabel, t)...))
	f.Add(append(append([]byte{}, hello...), auth...))
	f.Add(hello)
	f.Add(append(append([]byte{}, hello...), 0, 0, 0, 1, TypeAuth))
	f.Add([]byte{0, 0, 0, 1, TypeHello})
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Add([]byte{})
	for _, s := range serverHandshakeSeeds() {
		f.Add(s.data)
	}

	cfgs := fuzzServerCfgs()
	f.Fuzz(func(t *testing.T, data []byte) {
		for ci, cfg := range cfgs {
			rw := newFuzzRW(data)
			peer, err := ServerHandshake(rw, cfg)
			w := wantServer(cfg, data)
			if rw.readAfterEOF {
				t.Fatalf("port %d: server read again after io.EOF (input %x)", cfg.Kind, data)
			}
			if (err == nil) != (w.err == nil) || (err != nil && !errors.Is(err, w.err)) {
				t.Fatalf("port %d: input %x: got %v, want %v", cfg.Kind, data, err, w.err)
			}
			if err != nil && !isAny(err, handshakeErrs()...) {
				t.Fatalf("port %d: error outside the documented classes: %v", cfg.Kind, err)
			}
			// Exactly the Hello and the Auth are read, never what follows.
			if got := rw.consumed(); got != w.consumed {
				t.Fatalf("port %d: server read %d bytes of %d, its frames end at %d (err %v)", cfg.Kind, got, len(data), w.consumed, err)
			}
			out, rest := specFrames(rw.w.Bytes())
			if len(rest) != 0 {
				t.Fatalf("port %d: server wrote a partial frame % x", cfg.Kind, rest)
			}
			i := 0
			if w.challenges {
				// The Challenge proves each of the server's secrets, current
				// first, over this Hello.
				if len(out) == 0 || out[0].typ != TypeChallenge {
					t.Fatalf("port %d: server accepted the hello but wrote % x", cfg.Kind, rw.w.Bytes())
				}
				ch, ok := parseSpecChallenge(out[0].payload)
				h := w.hello
				version := min(h.maxV, ProtocolVersion)
				tr := specTranscript(version, h.kind, h.cn, ch.sn, cfg.ClusterID, cfg.NodeID, h.sender, h.expect, h.domain, cfg.Domain, nil)
				secrets := [][]byte{cfg.Secret}
				if cfg.NextSecret != nil {
					secrets = append(secrets, cfg.NextSecret)
				}
				ok = ok && ch.version == version && ch.serverID == cfg.NodeID && ch.clusterID == cfg.ClusterID && ch.domain == cfg.Domain &&
					bytes.Equal(ch.sn, make([]byte, NonceLen)) && len(ch.proofs) == len(secrets)
				for j := 0; ok && j < len(secrets); j++ {
					ok = bytes.Equal(ch.proofs[j], specProof(secrets[j], specServerLabel, tr))
				}
				if !ok {
					t.Fatalf("port %d: challenge % x parsed as %+v", cfg.Kind, out[0].raw, ch)
				}
				i = 1
			}
			if err == nil {
				// Only the real proof can pass (the Hello may vary in what
				// the transcript does not cover, such as max_version).
				// wantServer checks the proof for any Hello; this is the
				// seed's own case.
				sameTranscript := ci == 0 && min(w.hello.maxV, ProtocolVersion) == ProtocolVersion && bytes.Equal(w.hello.cn, cn) && w.hello.sender == "" && w.hello.expect == "" && w.hello.domain == ""
				if (sameTranscript && !bytes.Contains(data, auth[5:])) || peer.Version != min(w.hello.maxV, ProtocolVersion) {
					t.Fatalf("handshake accepted %x as %+v", data, peer)
				}
				if peer.NodeID != w.hello.sender || peer.ClusterID != w.hello.cluster || peer.Kind != w.hello.kind ||
					peer.Domain != w.hello.domain || peer.MaxInFlight != 0 || peer.MaxWaiters != 0 {
					t.Fatalf("port %d: peer %+v, hello %+v", cfg.Kind, peer, w.hello)
				}
				// The reply stream is exactly Challenge then the Welcome of
				// the negotiated version (version 4: with the limits).
				if len(out) != 2 || !bytes.Equal(out[1].raw, specWelcomeFor(peer.Version, cfg)) {
					t.Fatalf("port %d: successful handshake wrote % x, want Challenge then Welcome", cfg.Kind, rw.w.Bytes())
				}
				continue
			}
			// A failed handshake writes at most the Challenge, then one
			// connection-level error when the server detected the failure,
			// and never a Welcome.
			if i < len(out) {
				var m Msg
				if e := DecodeMsg(out[i].typ, out[i].payload, &m); e != nil || m.Type != TypeError || m.ID != 0 ||
					!w.sendsE || m.Code != CodeOf(w.err) {
					t.Fatalf("port %d: after %v the server wrote % x (%+v, %v)", cfg.Kind, err, out[i].raw, m, e)
				}
				i++
			} else if w.sendsE {
				t.Fatalf("port %d: server detected %v but sent no error frame", cfg.Kind, err)
			}
			if i != len(out) {
				t.Fatalf("port %d: failed handshake (%v) wrote % x", cfg.Kind, err, rw.w.Bytes())
			}
		}
	})
}

// fuzzServerCfgs are the servers FuzzHandshake plays: a client port (n1)
// of a node that knows no fencing domain yet, a peer port (server id
// n1/abcdefghij, name n1) in a secret rollover, which also takes discovery,
// and the client port of the same n1 in fencing domain "d1". All draw a zero
// server nonce.
func fuzzServerCfgs() []HandshakeConfig {
	return []HandshakeConfig{
		{Kind: KindClient, Secret: clientSecret, ClusterID: "prod", NodeID: "n1", Rand: zeroRand{}, MaxInFlight: 4096, MaxWaiters: 200000},
		{Kind: KindPeer, Secret: peerSecret, NextSecret: nextPeerSecret, ClusterID: "prod", NodeID: "n1/abcdefghij", NodeName: "n1", Rand: zeroRand{}},
		{Kind: KindClient, Secret: clientSecret, ClusterID: "prod", Domain: "d1", NodeID: "n1", Rand: zeroRand{}, MaxInFlight: math.MaxUint32, MaxWaiters: 1},
	}
}

// fuzzClientCfgs are the diallers FuzzClientHandshake plays: a plain client
// accepting any node id and any fencing domain, a peer in a secret rollover
// that expects n1, a discovering node that knows only the name n1, and a
// client that holds to fencing domain "d1" (a sidecar that pinned it). All
// draw a zero client nonce.
func fuzzClientCfgs() []HandshakeConfig {
	return []HandshakeConfig{
		{Kind: KindClient, Secret: clientSecret, ClusterID: "prod", Rand: zeroRand{}},
		{Kind: KindPeer, Secret: peerSecret, NextSecret: nextPeerSecret, ClusterID: "prod", NodeID: "n2", ExpectNodeID: "n1", Rand: zeroRand{}},
		{Kind: KindDiscover, Secret: peerSecret, ClusterID: "prod", NodeID: "n2/zzzzzzzzzz", ExpectNodeID: "n1", Rand: zeroRand{}},
		{Kind: KindClient, Secret: clientSecret, ClusterID: "prod", Domain: "d1", Rand: zeroRand{}},
	}
}

// FuzzClientHandshake: the dialler fed arbitrary server bytes (a fake or
// hostile node) never panics, reads exactly the frames it needs and nothing
// after them, and succeeds only on a Challenge with a valid server proof
// for its nonce followed by the Welcome of that version (empty before 4,
// the two limits from 4). It sends its own proof only
// after such a Challenge, and otherwise at most one connection-level E.
// Every outcome is compared with wantClient, a reading of PROTOCOL.md that
// shares no code with the handshake.
func FuzzClientHandshake(f *testing.F) {
	for _, s := range clientHandshakeSeeds() {
		f.Add(s.data)
	}
	cfgs := fuzzClientCfgs()
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, cfg := range cfgs {
			rw := newFuzzRW(data)
			peer, err := ClientHandshake(rw, cfg)
			w := wantClient(cfg, data)
			if rw.readAfterEOF {
				t.Fatalf("kind %d: client read again after io.EOF", cfg.Kind)
			}
			if (err == nil) != (w.err == nil) || (err != nil && !errors.Is(err, w.err)) {
				t.Fatalf("kind %d: input %x: got %v, want %v", cfg.Kind, data, err, w.err)
			}
			if err == nil && (peer.Version != w.ch.version || peer.NodeID != w.ch.serverID || peer.ClusterID != w.ch.clusterID ||
				peer.Domain != w.ch.domain || peer.MaxInFlight != w.maxInFlight || peer.MaxWaiters != w.maxWaiters) {
				t.Fatalf("kind %d: peer %+v, challenge %+v", cfg.Kind, peer, w.ch)
			}
			if got := rw.consumed(); got != w.consumed {
				t.Fatalf("kind %d: client read %d bytes of %d, its frames end at %d (err %v)", cfg.Kind, got, len(data), w.consumed, err)
			}

			out, rest := specFrames(rw.w.Bytes())
			if len(rest) != 0 {
				t.Fatalf("kind %d: client wrote a partial frame % x", cfg.Kind, rest)
			}
			if len(out) == 0 || out[0].typ != TypeHello {
				t.Fatalf("kind %d: client did not start with a Hello: % x", cfg.Kind, rw.w.Bytes())
			}
			i := 1
			if w.proofOK {
				// The server proved itself: the Auth, with the secret
				// whose proof matched, is the next frame.
				if len(out) < 2 || out[1].typ != TypeAuth || !bytes.Equal(out[1].payload, specProof(w.secret, specClientLabel, w.tr)) {
					t.Fatalf("kind %d: after a valid challenge the client wrote % x", cfg.Kind, rw.w.Bytes())
				}
				i = 2
			}
			if i < len(out) {
				var m Msg
				e := DecodeMsg(out[i].typ, out[i].payload, &m)
				if e != nil || m.Type != TypeError || m.ID != 0 || m.Code == 0 || !(w.sendsE || w.mayE) ||
					(w.sendsE && m.Code != CodeOf(w.err)) {
					t.Fatalf("kind %d: after %v the client wrote % x (%+v, %v)", cfg.Kind, err, out[i].raw, m, e)
				}
				i++
			} else if w.sendsE {
				t.Fatalf("kind %d: client detected %v but sent no error frame", cfg.Kind, err)
			}
			if i != len(out) {
				t.Fatalf("kind %d: client wrote % x (err %v)", cfg.Kind, rw.w.Bytes(), err)
			}
		}
	})
}

// chunkReader returns at most k bytes per Read and, with eofWithData, the
// final bytes together with io.EOF (both are legal io.Reader behaviour).
// A zero-length Read would spin a real reader; it gets errZeroRead.
type chunkReader struct {
	data        []byte
	k           int
	eofWithData bool
}

var errZeroRead = errors.New("test: Read with an empty buffer")

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, errZeroRead
	}
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.k)], c.data)
	c.data = c.data[n:]
	if len(c.data) == 0 && c.eofWithData {
		return n, io.EOF
	}
	return n, nil
}

// chunkParams maps the first input byte of FuzzReader to the read size
// (1..64, or 140..8960 in steps of 140, which passes MaxFrameBytes) and
// whether the last data comes with io.EOF (top bit).
func chunkParams(b byte) (k int, eofWithData bool) {
	v := int(b & 0x7F)
	if v < 64 {
		k = v + 1
	} else {
		k = (v - 63) * 140
	}
	return k, b&0x80 != 0
}

// FuzzReader drives the node's read path, Reader.ReadMsg in a loop, over
// arbitrary bytes cut into reads of a fuzzer-chosen size (first input byte,
// see chunkParams). It checks the Reader against specNext, a reading of
// the Framing section that shares no code with it: the same messages and
// decode errors in the same order, then the same end (io.EOF at a frame
// boundary, io.ErrUnexpectedEOF inside a frame, or a framing error), which
// is sticky. Every error is a documented sentinel, every decoded message
// is within the protocol's bounds and re-encodes to its frame, and the
// Reader's buffer never grows beyond MaxFrameBytes.
func FuzzReader(f *testing.F) {
	for _, s := range readerSeeds() {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		k, eofWithData := chunkParams(data[0])
		stream := data[1:]
		r := NewReader(&chunkReader{data: stream, k: k, eofWithData: eofWithData})
		rest := stream
		for calls := 0; ; calls++ {
			if calls > len(stream)/5+1 { // every frame takes at least 5 bytes
				t.Fatalf("%d messages out of %d bytes", calls, len(stream))
			}
			fr, end, ferr := specNext(rest)
			var m Msg
			err := r.ReadMsg(&m)
			checkReaderState(t, r)
			if ferr != nil {
				// End of the stream or a framing error: reported as such,
				// and again on the next call (the stream is dead).
				if ferr == io.EOF || ferr == io.ErrUnexpectedEOF {
					if err != ferr {
						t.Fatalf("at offset %d: got %v, want %v", len(stream)-len(rest), err, ferr)
					}
				} else if !errors.Is(err, ferr) {
					t.Fatalf("at offset %d: got %v, want %v", len(stream)-len(rest), err, ferr)
				}
				var m2 Msg
				if err2 := r.ReadMsg(&m2); err2 != err {
					t.Fatalf("error not sticky: %v then %v", err, err2)
				}
				return
			}
			rest = rest[end:]
			var want Msg
			werr := DecodeMsg(fr.typ, fr.payload, &want)
			if !reflect.DeepEqual(m, want) || (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
				t.Fatalf("frame % x: Reader gave %+v, %v; want %+v, %v", fr.raw, m, err, want, werr)
			}
			if err != nil {
				if !isAny(err, ErrMalformed, ErrUnknownType, ErrUnexpectedFrame) {
					t.Fatalf("decode error outside the documented classes: %v", err)
				}
				if m.Type != fr.typ {
					t.Fatalf("decode error left type %q, frame has %q", m.Type, fr.typ)
				}
				if IsFieldError(err) && (m.ID == 0 || (m.Type != TypeAcquire && m.Type != TypeAcquireBlock && m.Type != TypeRelease && m.Type != TypeExtend)) {
					t.Fatalf("field error %v for %+v: a server could not answer it under an id", err, m)
				}
				continue
			}
			checkMsgBounds(t, &m, fr.raw)
		}
	})
}

// checkReaderState: the buffer is the one fixed MaxFrameBytes allocation
// and the indexes stay inside it.
func checkReaderState(t *testing.T, r *Reader) {
	t.Helper()
	if len(r.buf) != MaxFrameBytes || cap(r.buf) != MaxFrameBytes {
		t.Fatalf("reader buffer len %d cap %d, want %d", len(r.buf), cap(r.buf), MaxFrameBytes)
	}
	if r.head < 0 || r.head > r.tail || r.tail > len(r.buf) || r.Buffered() > MaxFrameBytes {
		t.Fatalf("reader indexes head %d tail %d", r.head, r.tail)
	}
}

// checkMsgBounds: a decoded message holds nothing the protocol does not
// allow (so a peer cannot make the node hold more than one frame's worth of
// strings per message), and re-encodes to exactly its frame.
func checkMsgBounds(t *testing.T, m *Msg, raw []byte) {
	t.Helper()
	if !IsRequest(m.Type) && !IsReply(m.Type) && !IsNotice(m.Type) && !IsEvent(m.Type) && !IsProgress(m.Type) {
		t.Fatalf("decoded a frame of type %q", m.Type)
	}
	// Only the block acquire may exceed the bound of versions 1–4.
	if len(raw)-4 > MaxFrameLenV4 && m.Type != TypeAcquireBlock {
		t.Fatalf("decoded a %d-byte %q frame", len(raw)-4, m.Type)
	}
	if (m.ID == 0) != (m.Type == TypeNotice || m.Type == TypeLost || m.Type == TypeOutcomes) && m.Type != TypeError {
		t.Fatalf("decoded id %d for %q: %+v", m.ID, m.Type, m)
	}
	switch m.Type {
	case TypeLost:
		if m.Token == 0 || m.Reason != LostExpired || len(m.Key) < 1 || len(m.Key) > locksm.MaxKeyLen || m.Owner != "" {
			t.Fatalf("lost event %+v", m)
		}
	case TypeAcquire, TypeRelease, TypeExtend:
		if len(m.Key) < 1 || len(m.Key) > locksm.MaxKeyLen || len(m.Owner) < 1 || len(m.Owner) > locksm.MaxOwnerLen || m.Keys != nil {
			t.Fatalf("key %d / owner %d bytes, %d block keys", len(m.Key), len(m.Owner), len(m.Keys))
		}
	case TypeAcquireBlock:
		if m.Key != "" || len(m.Keys) < locksm.MinBlockKeys || len(m.Keys) > locksm.MaxBlockKeys || len(m.Owner) < 1 || len(m.Owner) > locksm.MaxOwnerLen {
			t.Fatalf("block of %d keys (key %q), owner %d bytes", len(m.Keys), m.Key, len(m.Owner))
		}
		for _, k := range m.Keys {
			if len(k) < 1 || len(k) > locksm.MaxKeyLen {
				t.Fatalf("block key of %d bytes", len(k))
			}
		}
	case TypeCancel:
		if m.Target == 0 {
			t.Fatal("cancel target 0")
		}
	case TypePosition:
		if m.Position == 0 || len(m.Key) < 1 || len(m.Key) > locksm.MaxKeyLen || m.Owner != "" {
			t.Fatalf("position %+v", m)
		}
	case TypeOpenSession, TypeResume, TypeOutcomes:
		if m.Session == 0 {
			t.Fatalf("%q for session 0", m.Type)
		}
	case TypeError:
		if m.Code == 0 || len(m.Text) > MaxTextLen {
			t.Fatalf("error code %d, text %d bytes", m.Code, len(m.Text))
		}
	case TypeUnknown:
		// U has no code, so its text can be 2 bytes longer than E's.
		if len(m.Text) > MaxFrameLenV4-1-8-2 {
			t.Fatalf("unknown text %d bytes", len(m.Text))
		}
	case TypeStatusR:
		if m.Role > RoleShutdown {
			t.Fatalf("role %d", m.Role)
		}
	case TypeNotice:
		if m.Event != NoticeHandOver && m.Event != NoticeServing {
			t.Fatalf("notice event %d", m.Event)
		}
	}
	for _, s := range []string{m.LeaderAddr, m.LeaderID, m.NodeID} {
		if len(s) > 255 {
			t.Fatalf("str8 field of %d bytes", len(s))
		}
	}
	n := len(m.Key) + len(m.Owner) + len(m.Text) + len(m.LeaderAddr) + len(m.LeaderID) + len(m.NodeID)
	for _, mb := range m.Members {
		if mb.ServerID == "" || len(mb.ServerID) > 255 || len(mb.ClientAddr) > 255 || mb.Suffrage > SuffrageLearner {
			t.Fatalf("member %+v", mb)
		}
		n += 3 + len(mb.ServerID) + len(mb.ClientAddr) // each entry costs its strings plus 3 bytes
	}
	for _, k := range m.Keys {
		n += 1 + len(k) // each block key costs its bytes plus its length byte
	}
	if n > len(raw)-5 {
		t.Fatalf("%d bytes of strings from a %d-byte payload", n, len(raw)-5)
	}
	enc, err := AppendMsg(nil, m)
	if err != nil || !bytes.Equal(enc, raw) {
		t.Fatalf("%+v re-encodes to % x, %v; frame % x", m, enc, err, raw)
	}
}
