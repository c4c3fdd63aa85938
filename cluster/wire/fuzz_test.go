package wire

import (
	"bytes"
	"io"
	"testing"
)

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
			if err := DecodeMsg(enc[4], enc[5:], &m2); err != nil || m2 != m {
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

// fuzzRW feeds the server the fuzz input and discards what it writes.
type fuzzRW struct{ io.Reader }

func (fuzzRW) Write(p []byte) (int, error) { return len(p), nil }

// FuzzHandshake: a server fed arbitrary client bytes never panics, and
// succeeds only on a correct proof.
func FuzzHandshake(f *testing.F) {
	cfg := HandshakeConfig{Kind: KindClient, Secret: clientSecret, ClusterID: "prod", NodeID: "n1", Rand: zeroRand{}}
	// A valid Hello and the matching Auth for a zero server nonce.
	hello := []byte{0, 0, 0, 0, TypeHello}
	hello = append(hello, Magic...)
	hello = append(hello, 0, 1, 0, 1, byte(KindClient))
	cn := bytes.Repeat([]byte{7}, NonceLen)
	hello = append(hello, cn...)
	hello = append(hello, 4, 'p', 'r', 'o', 'd', 0, 0)
	hello = finishFrame(hello)
	var sn [NonceLen]byte
	t := transcript(1, KindClient, cn, sn[:], "prod", "n1", "", "", nil)
	auth := finishFrame(append([]byte{0, 0, 0, 0, TypeAuth}, proof(clientSecret, clientLabel, t)...))
	f.Add(append(append([]byte{}, hello...), auth...))
	f.Add(hello)
	f.Add(append(append([]byte{}, hello...), 0, 0, 0, 1, TypeAuth))
	f.Add([]byte{0, 0, 0, 1, TypeHello})
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, data []byte) {
		peer, err := ServerHandshake(fuzzRW{bytes.NewReader(data)}, cfg)
		if err == nil {
			// Only the real proof can pass (the Hello may vary in what the
			// transcript does not cover, such as max_version).
			if !bytes.Contains(data, auth[5:]) || peer.Version != 1 {
				t.Fatalf("handshake accepted %x as %+v", data, peer)
			}
		}
	})
}
