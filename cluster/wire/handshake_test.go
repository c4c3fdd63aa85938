package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	clientSecret = []byte("client-secret-0123456789")
	peerSecret   = []byte("peer-secret-abcdefghijklm")
)

type hsResult struct {
	peer Peer
	err  error
}

// runPair runs both sides over net.Pipe and returns their results. Each
// side closes its end when done, so a side blocked writing its error frame
// to a peer that already gave up is released.
func runPair(t *testing.T, ccfg, scfg HandshakeConfig, client func(io.ReadWriter, HandshakeConfig) (Peer, error)) (c, s hsResult) {
	t.Helper()
	newest := uint16(ProtocolVersion) // as ServerHandshake picks it
	if scfg.MaxVersion != 0 {
		newest = scfg.MaxVersion
	}
	return runPairVersions(t, ccfg, scfg, client, newest)
}

// runPairVersions is runPair with a server whose newest version is newest.
func runPairVersions(t *testing.T, ccfg, scfg HandshakeConfig, client func(io.ReadWriter, HandshakeConfig) (Peer, error), newest uint16) (c, s hsResult) {
	t.Helper()
	cc, sc := net.Pipe()
	deadline := time.Now().Add(5 * time.Second)
	cc.SetDeadline(deadline)
	sc.SetDeadline(deadline)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer cc.Close()
		c.peer, c.err = client(cc, ccfg)
	}()
	go func() {
		defer wg.Done()
		defer sc.Close()
		s.peer, s.err = serverHandshake(sc, scfg, newest)
	}()
	wg.Wait()
	return c, s
}

func clientPair() (HandshakeConfig, HandshakeConfig) {
	return HandshakeConfig{Kind: KindClient, Secret: clientSecret, ClusterID: "prod"},
		HandshakeConfig{Kind: KindClient, Secret: clientSecret, ClusterID: "prod", NodeID: "n1"}
}

func peerPair() (HandshakeConfig, HandshakeConfig) {
	return HandshakeConfig{Kind: KindPeer, Secret: peerSecret, ClusterID: "prod", NodeID: "n2", ExpectNodeID: "n1"},
		HandshakeConfig{Kind: KindPeer, Secret: peerSecret, ClusterID: "prod", NodeID: "n1"}
}

func TestHandshakeSuccess(t *testing.T) {
	for _, kind := range []string{"client", "peer", "client-tls-binding"} {
		t.Run(kind, func(t *testing.T) {
			ccfg, scfg := clientPair()
			if kind == "peer" {
				ccfg, scfg = peerPair()
			}
			if kind == "client-tls-binding" {
				ccfg.ChannelBinding = []byte("exporter-value")
				scfg.ChannelBinding = []byte("exporter-value")
			}
			c, s := runPair(t, ccfg, scfg, ClientHandshake)
			if c.err != nil || s.err != nil {
				t.Fatalf("client %v, server %v", c.err, s.err)
			}
			if c.peer.NodeID != "n1" || c.peer.Version != ProtocolVersion || c.peer.ClusterID != "prod" {
				t.Errorf("client learned %+v", c.peer)
			}
			if s.peer.NodeID != ccfg.NodeID || s.peer.Version != ProtocolVersion {
				t.Errorf("server learned %+v", s.peer)
			}
		})
	}
}

// TestHandshakeNoOverRead: bytes the client sends right after its Auth are
// left in the connection for the caller.
func TestHandshakeNoOverRead(t *testing.T) {
	ccfg, scfg := clientPair()
	cc, sc := net.Pipe()
	defer cc.Close()
	defer sc.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := ClientHandshake(cc, ccfg)
		if err == nil {
			ping, _ := AppendMsg(nil, &Msg{Type: TypePing, ID: 1})
			_, err = cc.Write(ping)
		}
		errc <- err
	}()
	if _, err := ServerHandshake(sc, scfg); err != nil {
		t.Fatal(err)
	}
	var m Msg
	if err := NewReader(sc).ReadMsg(&m); err != nil || m.Type != TypePing || m.ID != 1 {
		t.Fatalf("after handshake: %+v %v", m, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestHandshakeFailures(t *testing.T) {
	other := []byte("another-secret-0123456789")
	cases := []struct {
		name       string
		mod        func(c, s *HandshakeConfig)
		peer       bool
		clientWant error
		serverWant error
	}{
		{"client detects fake server", func(c, s *HandshakeConfig) { s.Secret = other }, false, ErrAuthFailed, ErrAuthFailed},
		{"server detects bad client", func(c, s *HandshakeConfig) { c.Secret = other }, false, ErrAuthFailed, ErrAuthFailed},
		{"peer wrong secret", func(c, s *HandshakeConfig) { c.Secret = other }, true, ErrAuthFailed, ErrAuthFailed},
		{"wrong cluster", func(c, s *HandshakeConfig) { c.ClusterID = "staging" }, false, ErrWrongCluster, ErrWrongCluster},
		{"wrong cluster peer", func(c, s *HandshakeConfig) { s.ClusterID = "" }, true, ErrWrongCluster, ErrWrongCluster},
		{"wrong expected node", func(c, s *HandshakeConfig) { c.ExpectNodeID = "n3" }, true, ErrWrongNode, ErrWrongNode},
		{"client expects node", func(c, s *HandshakeConfig) { c.ExpectNodeID = "n9" }, false, ErrWrongNode, ErrWrongNode},
		{"binding differs", func(c, s *HandshakeConfig) { c.ChannelBinding = []byte("relay") }, false, ErrAuthFailed, ErrAuthFailed},
		{"client on peer port", func(c, s *HandshakeConfig) { s.Kind, s.Secret = KindPeer, peerSecret }, false, ErrMalformed, ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ccfg, scfg := clientPair()
			if tc.peer {
				ccfg, scfg = peerPair()
			}
			tc.mod(&ccfg, &scfg)
			c, s := runPair(t, ccfg, scfg, ClientHandshake)
			if !errors.Is(c.err, tc.clientWant) {
				t.Errorf("client: %v, want %v", c.err, tc.clientWant)
			}
			if !errors.Is(s.err, tc.serverWant) {
				t.Errorf("server: %v, want %v", s.err, tc.serverWant)
			}
		})
	}
}

// TestFakeServerNodeID: a server that knows the secret but does not check
// expect_id itself (a misconfigured or buggy node answering for another id)
// is still caught by the client, which then sends an error, not its proof.
func TestFakeServerNodeID(t *testing.T) {
	ccfg, _ := peerPair() // expects n1
	cc, sc := net.Pipe()
	defer cc.Close()
	sc.SetDeadline(time.Now().Add(5 * time.Second))
	got := make(chan []byte, 1)
	go func() {
		defer sc.Close()
		buf := make([]byte, MaxFrameBytes)
		_, p, err := readFrameExact(sc, buf)
		if err != nil {
			got <- nil
			return
		}
		cn := append([]byte{}, p[9:9+NonceLen]...)
		var sn [NonceLen]byte
		tr := transcript(ProtocolVersion, KindPeer, cn, sn[:], "prod", "n3", "n2", "n1", "", "", nil)
		ch := []byte{0, 0, 0, 0, TypeChallenge, 0, ProtocolVersion}
		ch = append(ch, sn[:]...)
		ch = appendStr8(ch, "n3")
		ch = appendStr8(ch, "prod")
		ch = appendStr8(ch, "") // domain
		ch = append(ch, 1)
		ch = append(ch, proof(peerSecret, serverLabel, tr)...)
		_, _ = sc.Write(finishFrame(ch))
		got <- nextFrame(sc, buf)
	}()
	if _, err := ClientHandshake(cc, ccfg); !errors.Is(err, ErrWrongNode) {
		t.Fatalf("client: %v", err)
	}
	wantErrorFrame(t, <-got, CodeWrongNode)
}

func TestHandshakeVersion(t *testing.T) {
	ccfg, scfg := clientPair()
	newer := func(rw io.ReadWriter, cfg HandshakeConfig) (Peer, error) {
		return clientHandshake(rw, cfg, ProtocolVersion+1, ProtocolVersion+3)
	}
	c, s := runPair(t, ccfg, scfg, newer)
	if !errors.Is(c.err, ErrVersion) || !errors.Is(s.err, ErrVersion) {
		t.Fatalf("client %v, server %v", c.err, s.err)
	}
	// A client that also speaks future versions gets the server's newest.
	wider := func(rw io.ReadWriter, cfg HandshakeConfig) (Peer, error) {
		return clientHandshake(rw, cfg, 1, ProtocolVersion+5)
	}
	c, s = runPair(t, ccfg, scfg, wider)
	if c.err != nil || s.err != nil || c.peer.Version != ProtocolVersion {
		t.Fatalf("client %v %+v, server %v", c.err, c.peer, s.err)
	}
}

// TestHandshakeLimits: a version 4 or 5 Welcome tells the dialler the
// node's per-connection limits; a version 2 or 3 client, or a version 3
// node, negotiates its own version and the Welcome is empty (limits 0: not
// told).
func TestHandshakeLimits(t *testing.T) {
	ccfg, scfg := clientPair()
	scfg.MaxInFlight, scfg.MaxWaiters = 4096, 200000
	c, s := runPair(t, ccfg, scfg, ClientHandshake)
	if c.err != nil || s.err != nil || c.peer.Version != ProtocolVersion || c.peer.MaxInFlight != 4096 || c.peer.MaxWaiters != 200000 {
		t.Fatalf("v%d: client %v %+v, server %v", ProtocolVersion, c.err, c.peer, s.err)
	}
	// A version 5 client and a version 4 node (and the other way round)
	// negotiate 4, whose Welcome has the same limits.
	c, s = runPairVersions(t, ccfg, scfg, ClientHandshake, VersionQueued)
	if c.err != nil || s.err != nil || c.peer.Version != VersionQueued || c.peer.MaxInFlight != 4096 || c.peer.MaxWaiters != 200000 {
		t.Fatalf("v4 node: client %v %+v, server %v", c.err, c.peer, s.err)
	}
	v4 := func(rw io.ReadWriter, cfg HandshakeConfig) (Peer, error) {
		return clientHandshake(rw, cfg, MinProtocolVersion, VersionQueued)
	}
	c, s = runPair(t, ccfg, scfg, v4)
	if c.err != nil || s.err != nil || c.peer.Version != VersionQueued || s.peer.Version != VersionQueued || c.peer.MaxInFlight != 4096 {
		t.Fatalf("v4 client: %v %+v, server %v", c.err, c.peer, s.err)
	}
	if s.peer.MaxInFlight != 0 || s.peer.MaxWaiters != 0 {
		t.Fatalf("server side learned limits: %+v", s.peer)
	}
	for _, v := range []uint16{2, 3} {
		older := func(rw io.ReadWriter, cfg HandshakeConfig) (Peer, error) {
			return clientHandshake(rw, cfg, MinProtocolVersion, v)
		}
		c, s = runPair(t, ccfg, scfg, older)
		if c.err != nil || s.err != nil || c.peer.Version != v || s.peer.Version != v || c.peer.MaxInFlight != 0 || c.peer.MaxWaiters != 0 {
			t.Fatalf("v%d client: %v %+v, server %v", v, c.err, c.peer, s.err)
		}
		// A version 5 client meets a node whose newest version is v.
		c, s = runPairVersions(t, ccfg, scfg, ClientHandshake, v)
		if c.err != nil || s.err != nil || c.peer.Version != v || c.peer.MaxInFlight != 0 || c.peer.MaxWaiters != 0 {
			t.Fatalf("v%d node: %v %+v, server %v", v, c.err, c.peer, s.err)
		}
	}
	// MaxVersion plays an older client through the exported API.
	for _, v := range []uint16{2, 3, 4, 5, 6} {
		cc := ccfg
		cc.MaxVersion = v
		c, s = runPair(t, cc, scfg, ClientHandshake)
		if c.err != nil || s.err != nil || c.peer.Version != v || (c.peer.MaxInFlight != 0) != (v >= VersionQueued) {
			t.Fatalf("MaxVersion %d: %v %+v, server %v", v, c.err, c.peer, s.err)
		}
	}
	// A version being built (NewestProtocolVersion above ProtocolVersion,
	// when there is one) is spoken only when both sides are set to it;
	// either side's default keeps ProtocolVersion.
	for _, tc := range []struct{ client, server, want uint16 }{
		{NewestProtocolVersion, NewestProtocolVersion, NewestProtocolVersion},
		{0, NewestProtocolVersion, ProtocolVersion},
		{NewestProtocolVersion, 0, ProtocolVersion},
	} {
		cc, sc := ccfg, scfg
		cc.MaxVersion, sc.MaxVersion = tc.client, tc.server
		c, s = runPair(t, cc, sc, ClientHandshake)
		if c.err != nil || s.err != nil || c.peer.Version != tc.want || s.peer.Version != tc.want {
			t.Fatalf("client %d, server %d: %v %+v, server %v %+v", tc.client, tc.server, c.err, c.peer, s.err, s.peer)
		}
	}
	var rw bytes.Buffer
	for _, v := range []uint16{1, NewestProtocolVersion + 1} {
		cc := ccfg
		cc.MaxVersion = v
		if _, err := ClientHandshake(&rw, cc); !errors.Is(err, ErrBadConfig) || rw.Len() != 0 {
			t.Errorf("MaxVersion %d: %v, wrote %d bytes", v, err, rw.Len())
		}
	}
	// The peer port tells no limits: zeros in a version 4 Welcome.
	pc, ps := peerPair()
	c, s = runPair(t, pc, ps, ClientHandshake)
	if c.err != nil || s.err != nil || c.peer.MaxInFlight != 0 || c.peer.MaxWaiters != 0 {
		t.Fatalf("peer: %v %+v, server %v", c.err, c.peer, s.err)
	}
}

// recordRW records what is written through it.
type recordRW struct {
	io.ReadWriter
	w bytes.Buffer
}

func (r *recordRW) Write(p []byte) (int, error) {
	r.w.Write(p)
	return r.ReadWriter.Write(p)
}

// TestHandshakeReplay: a recorded Hello+Auth from an earlier successful
// handshake is useless against a fresh server nonce.
func TestHandshakeReplay(t *testing.T) {
	ccfg, scfg := clientPair()
	var rec *recordRW
	c, s := runPair(t, ccfg, scfg, func(rw io.ReadWriter, cfg HandshakeConfig) (Peer, error) {
		rec = &recordRW{ReadWriter: rw}
		return ClientHandshake(rec, cfg)
	})
	if c.err != nil || s.err != nil {
		t.Fatal(c.err, s.err)
	}
	recorded := rec.w.Bytes()

	cc, sc := net.Pipe()
	defer cc.Close()
	cc.SetDeadline(time.Now().Add(5 * time.Second))
	errc := make(chan error, 1)
	go func() {
		defer sc.Close()
		_, err := ServerHandshake(sc, scfg)
		errc <- err
	}()
	go func() { _, _ = cc.Write(recorded) }() // Hello and the old Auth; net.Pipe blocks, so async
	r := NewReader(cc)
	typ, _, err := r.ReadFrame()
	if err != nil || typ != TypeChallenge {
		t.Fatalf("challenge: %q %v", typ, err)
	}
	var m Msg
	if err := r.ReadMsg(&m); err != nil || m.Type != TypeError || m.ID != 0 || m.Code != CodeAuthFailed {
		t.Fatalf("reply to replayed auth: %+v %v", m, err)
	}
	if err := <-errc; !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("server: %v", err)
	}
}

// TestServerRefusesGarbage: the server answers a non-Ticketing first frame
// with an error frame carrying the right code.
func TestServerRefusesGarbage(t *testing.T) {
	_, scfg := clientPair()
	hello := func(mut func([]byte) []byte) []byte {
		b := []byte{0, 0, 0, 0, TypeHello}
		b = append(b, Magic...)
		b = append(b, 0, ProtocolVersion, 0, ProtocolVersion, byte(KindClient))
		b = append(b, make([]byte, NonceLen)...)
		b = append(b, 4, 'p', 'r', 'o', 'd', 0, 0, 0) // cluster, sender, expect, domain
		return finishFrame(mut(b))
	}
	cases := []struct {
		name string
		in   []byte
		code Code
		want error
	}{
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), CodeFrameTooLarge, ErrFrameTooLarge},
		{"zero length", []byte{0, 0, 0, 0}, CodeBadRequest, ErrMalformed},
		{"request first", []byte{0, 0, 0, 9, 'p', 0, 0, 0, 0, 0, 0, 0, 1}, CodeUnexpectedFrame, ErrUnexpectedFrame},
		{"bad magic", hello(func(b []byte) []byte { b[5] = 'X'; return b }), CodeBadRequest, ErrMalformed},
		{"trailing", hello(func(b []byte) []byte { return append(b, 0) }), CodeBadRequest, ErrMalformed},
		{"min > max", hello(func(b []byte) []byte { b[10] = ProtocolVersion + 1; return b }), CodeVersion, ErrVersion},
		{"version 1", hello(func(b []byte) []byte { b[10], b[12] = 1, 1; return b }), CodeVersion, ErrVersion},
		{"version 0", hello(func(b []byte) []byte { b[10], b[12] = 0, 0; return b }), CodeVersion, ErrVersion},
		{"kind peer", hello(func(b []byte) []byte { b[13] = byte(KindPeer); return b }), CodeBadRequest, ErrMalformed},
		{"no domain field", hello(func(b []byte) []byte { return b[:len(b)-1] }), CodeBadRequest, ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cc, sc := net.Pipe()
			defer cc.Close()
			cc.SetDeadline(time.Now().Add(5 * time.Second))
			errc := make(chan error, 1)
			go func() {
				defer sc.Close()
				_, err := ServerHandshake(sc, scfg)
				errc <- err
			}()
			go func() { _, _ = cc.Write(tc.in) }()
			var m Msg
			if err := NewReader(cc).ReadMsg(&m); err != nil || m.Type != TypeError || m.Code != tc.code {
				t.Fatalf("reply %+v %v, want code %v", m, err, tc.code)
			}
			if err := <-errc; !errors.Is(err, tc.want) {
				t.Fatalf("server: %v, want %v", err, tc.want)
			}
		})
	}
}

func TestHandshakeConfigErrors(t *testing.T) {
	var rw bytes.Buffer // nothing must be written or read
	bad := []HandshakeConfig{
		{Kind: KindClient, Secret: []byte("short")},
		{Kind: 0, Secret: clientSecret},
		{Kind: KindPeer, Secret: peerSecret, NodeID: "n2"}, // dialler without ExpectNodeID
	}
	for i, cfg := range bad {
		if _, err := ClientHandshake(&rw, cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("client %d: %v", i, err)
		}
	}
	if _, err := ServerHandshake(&rw, HandshakeConfig{Kind: KindClient, Secret: []byte("0123456789abcde")}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("server 15-byte secret: %v", err)
	}
	if _, err := ServerHandshake(&rw, HandshakeConfig{Kind: KindPeer, Secret: peerSecret}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("peer server without NodeID: %v", err)
	}
	for _, lim := range [][2]int{{-1, 0}, {0, -1}, {1 << 32, 0}, {0, 1 << 32}} {
		cfg := HandshakeConfig{Kind: KindClient, Secret: clientSecret, MaxInFlight: lim[0], MaxWaiters: lim[1]}
		if _, err := ServerHandshake(&rw, cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("server limits %v: %v", lim, err)
		}
	}
	if rw.Len() != 0 {
		t.Errorf("config error wrote %d bytes", rw.Len())
	}
}

// TestSecretRollover: a server holding the current and the next secret
// accepts clients of either, and a client holding both reaches servers of
// either; a secret neither side shares still fails.
func TestSecretRollover(t *testing.T) {
	cur, next, other := clientSecret, []byte("next-client-secret-xyz0123"), []byte("unrelated-secret-qwertyuiop")
	cases := []struct {
		name           string
		client, server HandshakeConfig
		wantOK         bool
	}{
		{"old client, rolling server", HandshakeConfig{Secret: cur}, HandshakeConfig{Secret: cur, NextSecret: next}, true},
		{"new client, rolling server", HandshakeConfig{Secret: next}, HandshakeConfig{Secret: cur, NextSecret: next}, true},
		{"rolling client, old server", HandshakeConfig{Secret: next, NextSecret: cur}, HandshakeConfig{Secret: cur}, true},
		{"rolling client, new server", HandshakeConfig{Secret: cur, NextSecret: next}, HandshakeConfig{Secret: next}, true},
		{"stranger, rolling server", HandshakeConfig{Secret: other}, HandshakeConfig{Secret: cur, NextSecret: next}, false},
		{"rolling client, stranger server", HandshakeConfig{Secret: cur, NextSecret: next}, HandshakeConfig{Secret: other}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ccfg, scfg := clientPair()
			ccfg.Secret, ccfg.NextSecret = tc.client.Secret, tc.client.NextSecret
			scfg.Secret, scfg.NextSecret = tc.server.Secret, tc.server.NextSecret
			c, s := runPair(t, ccfg, scfg, ClientHandshake)
			if tc.wantOK {
				if c.err != nil || s.err != nil {
					t.Fatalf("client %v, server %v", c.err, s.err)
				}
				return
			}
			if !errors.Is(c.err, ErrAuthFailed) {
				t.Fatalf("client %v, want auth failure", c.err)
			}
			if s.err == nil {
				t.Fatal("server accepted a client without a shared secret")
			}
		})
	}
}

// TestChannelBindingMismatch: the same secret on both sides, but each side
// sees a different TLS session (a man in the middle relaying between two
// sessions): neither side accepts, and the client never sends a proof.
func TestChannelBindingMismatch(t *testing.T) {
	ccfg, scfg := clientPair()
	ccfg.ChannelBinding = bytes.Repeat([]byte{1}, ChannelBindingLen)
	scfg.ChannelBinding = bytes.Repeat([]byte{2}, ChannelBindingLen)
	c, s := runPair(t, ccfg, scfg, ClientHandshake)
	if !errors.Is(c.err, ErrAuthFailed) {
		t.Fatalf("client %v, want auth failure", c.err)
	}
	if !errors.Is(s.err, ErrAuthFailed) {
		t.Fatalf("server %v, want the client's auth_failed", s.err)
	}
}

// TestHandshakeDomain: the fencing domain is checked when both sides name
// one; a side that names none accepts the other's, and each side learns
// the other's domain.
func TestHandshakeDomain(t *testing.T) {
	cases := []struct {
		name                    string
		peer                    bool
		client, server          string // Domain of each side
		wantErr                 error  // nil: both succeed
		clientLearns, srvLearns string
	}{
		{"same domain", false, "a", "a", nil, "a", "a"},
		{"same domain peer", true, "a", "a", nil, "a", "a"},
		{"client names none, learns the server's", false, "", "a", nil, "a", ""},
		{"server names none, accepts any", false, "b", "", nil, "", "b"},
		{"server names none, peer", true, "b", "", nil, "", "b"},
		{"neither names one", false, "", "", nil, "", ""},
		{"different domains", false, "b", "a", ErrWrongDomain, "", ""},
		{"different domains peer", true, "b", "a", ErrWrongDomain, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ccfg, scfg := clientPair()
			if tc.peer {
				ccfg, scfg = peerPair()
			}
			ccfg.Domain, scfg.Domain = tc.client, tc.server
			c, s := runPair(t, ccfg, scfg, ClientHandshake)
			if tc.wantErr != nil {
				// The server refuses the Hello; the client gets its E.
				if !errors.Is(s.err, ErrWrongDomain) || !errors.Is(c.err, ErrWrongDomain) {
					t.Fatalf("client %v, server %v; want both %v", c.err, s.err, ErrWrongDomain)
				}
				if CodeOf(c.err) != CodeWrongDomain || !strings.Contains(c.err.Error(), "(wrong_domain)") {
					t.Fatalf("client error %q, want the server's wrong_domain code", c.err)
				}
				return
			}
			if c.err != nil || s.err != nil {
				t.Fatalf("client %v, server %v", c.err, s.err)
			}
			if c.peer.Domain != tc.clientLearns || s.peer.Domain != tc.srvLearns {
				t.Fatalf("client learned domain %q, server %q; want %q, %q", c.peer.Domain, s.peer.Domain, tc.clientLearns, tc.srvLearns)
			}
		})
	}
	if CodeWrongDomain.String() != "wrong_domain" || CodeOf(ErrWrongDomain) != CodeWrongDomain || ErrOf(30) != ErrWrongDomain {
		t.Fatalf("code 30: %q %d %v", CodeWrongDomain, CodeOf(ErrWrongDomain), ErrOf(30))
	}
}

// relayPair runs client and server through a relay that rewrites the
// domain of the Hello (to helloDomain) and of the Challenge (to chDomain)
// when those are not nil, and forwards everything else frame by frame.
func relayPair(t *testing.T, ccfg, scfg HandshakeConfig, helloDomain, chDomain *string) (c, s hsResult) {
	t.Helper()
	cc, rc := net.Pipe() // client - relay
	rs, sc := net.Pipe() // relay - server
	deadline := time.Now().Add(5 * time.Second)
	for _, p := range []net.Conn{cc, rc, rs, sc} {
		p.SetDeadline(deadline)
	}
	forward := func(from, to net.Conn, rewrite func(typ byte, raw, payload []byte) []byte) {
		defer to.Close()
		defer from.Close()
		buf := make([]byte, MaxFrameBytes)
		for {
			typ, payload, err := readFrameExact(from, buf)
			if err != nil {
				return
			}
			raw := buf[:headerLen+1+len(payload)]
			if _, err := to.Write(rewrite(typ, raw, payload)); err != nil {
				return
			}
		}
	}
	var wg sync.WaitGroup
	wg.Add(4)
	go func() {
		defer wg.Done()
		forward(rc, rs, func(typ byte, raw, _ []byte) []byte {
			if h, _, ok := parseSpecHello(raw); ok && typ == TypeHello && helloDomain != nil {
				return specHelloFrame(h.minV, h.maxV, h.kind, h.cn, h.cluster, h.sender, h.expect, *helloDomain)
			}
			return raw
		})
	}()
	go func() {
		defer wg.Done()
		forward(rs, rc, func(typ byte, raw, payload []byte) []byte {
			if ch, ok := parseSpecChallenge(payload); ok && typ == TypeChallenge && chDomain != nil {
				return specChallengeFrame(ch.version, ch.sn, ch.serverID, ch.clusterID, *chDomain, ch.proofs...)
			}
			return raw
		})
	}()
	go func() {
		defer wg.Done()
		defer cc.Close()
		c.peer, c.err = ClientHandshake(cc, ccfg)
	}()
	go func() {
		defer wg.Done()
		defer sc.Close()
		s.peer, s.err = ServerHandshake(sc, scfg)
	}()
	wg.Wait()
	return c, s
}

// TestHandshakeDomainTampered: a man in the middle (holding no secret) that
// rewrites the domain fields cannot make two sides of different domains
// agree: stripping the dialler's domain gets it past the server, but the
// client then sees the server's domain and refuses itself (before it sends
// a proof); stripping the server's too leaves the two transcripts
// different, so the server proof fails at the client.
func TestHandshakeDomainTampered(t *testing.T) {
	empty := ""
	ccfg, scfg := clientPair()
	ccfg.Domain, scfg.Domain = "b", "a"

	c, s := relayPair(t, ccfg, scfg, &empty, nil)
	if !errors.Is(c.err, ErrWrongDomain) || !strings.Contains(c.err.Error(), `server is in fencing domain "a"`) {
		t.Fatalf("hello stripped: client %v, want its own wrong_domain", c.err)
	}
	if !errors.Is(s.err, ErrWrongDomain) || !strings.Contains(s.err.Error(), "refused by client (wrong_domain)") {
		t.Fatalf("hello stripped: server %v, want the client's wrong_domain", s.err)
	}

	c, s = relayPair(t, ccfg, scfg, &empty, &empty)
	if !errors.Is(c.err, ErrAuthFailed) || !errors.Is(s.err, ErrAuthFailed) {
		t.Fatalf("both stripped: client %v, server %v; want auth_failed", c.err, s.err)
	}

	// A relay that rewrites nothing changes nothing.
	ccfg.Domain = "a"
	if c, s = relayPair(t, ccfg, scfg, nil, nil); c.err != nil || s.err != nil || c.peer.Domain != "a" || s.peer.Domain != "a" {
		t.Fatalf("plain relay: client %v %+v, server %v %+v", c.err, c.peer, s.err, s.peer)
	}
}

// TestFakeServerDomain: a server that knows the secret but does not check
// domains (another build, or a node answering for another domain) is still
// caught by a client that names its domain: it sends wrong_domain, not its
// proof.
func TestFakeServerDomain(t *testing.T) {
	ccfg, _ := clientPair()
	ccfg.Domain = "b"
	cc, sc := net.Pipe()
	defer cc.Close()
	sc.SetDeadline(time.Now().Add(5 * time.Second))
	got := make(chan []byte, 1)
	go func() {
		defer sc.Close()
		buf := make([]byte, MaxFrameBytes)
		_, p, err := readFrameExact(sc, buf)
		if err != nil {
			got <- nil
			return
		}
		h, _, ok := parseSpecHello(finishFrame(append([]byte{0, 0, 0, 0, TypeHello}, p...)))
		if !ok || h.domain != "b" {
			got <- nil
			return
		}
		sn := make([]byte, NonceLen)
		tr := specTranscript(ProtocolVersion, KindClient, h.cn, sn, "prod", "n1", "", "", "b", "a", nil)
		_, _ = sc.Write(specChallengeFrame(ProtocolVersion, sn, "n1", "prod", "a", specProof(clientSecret, specServerLabel, tr)))
		got <- nextFrame(sc, buf)
	}()
	if _, err := ClientHandshake(cc, ccfg); !errors.Is(err, ErrWrongDomain) {
		t.Fatalf("client: %v", err)
	}
	wantErrorFrame(t, <-got, CodeWrongDomain)
}

// nextFrame reads one frame as type byte + payload; nil if none came.
func nextFrame(r io.Reader, buf []byte) []byte {
	typ, p, err := readFrameExact(r, buf)
	if err != nil {
		return nil
	}
	return append([]byte{typ}, p...)
}

// wantErrorFrame: f (type byte + payload) is an E frame with code.
func wantErrorFrame(t *testing.T, f []byte, code Code) {
	t.Helper()
	var m Msg
	if len(f) == 0 || DecodeMsg(f[0], f[1:], &m) != nil || m.Type != TypeError || m.Code != code {
		t.Fatalf("fake server received %x, want an error frame with code %d", f, code)
	}
}

// The Identity frame carries client_addr from version 3 only: each
// version reads exactly its own layout, so a version 2 peer never sees the
// field and a version 3 reader of a version 2 frame gets no address.
func TestIdentityLayoutByVersion(t *testing.T) {
	id := Identity{HasState: true, Domain: "d1", Applied: 42, ClientAddr: "10.0.0.4:7400"}
	var v3, v2 bytes.Buffer
	if err := WriteIdentity(&v3, id, VersionNotices); err != nil {
		t.Fatal(err)
	}
	if err := WriteIdentity(&v2, id, VersionNotices-1); err != nil {
		t.Fatal(err)
	}
	// v2: flags | str8 domain | u64 applied; v3 appends str8 client_addr.
	want2 := []byte{0, 0, 0, 1 + 1 + 1 + 2 + 8, TypeIdentity, 1, 2, 'd', '1', 0, 0, 0, 0, 0, 0, 0, 42}
	if !bytes.Equal(v2.Bytes(), want2) {
		t.Fatalf("version 2 identity % x, want % x", v2.Bytes(), want2)
	}
	if !bytes.Equal(v3.Bytes()[5:], append(append([]byte{}, want2[5:]...), append([]byte{13}, id.ClientAddr...)...)) {
		t.Fatalf("version 3 identity % x", v3.Bytes())
	}
	got, err := ReadIdentity(bytes.NewReader(v3.Bytes()), VersionNotices)
	if err != nil || got != id {
		t.Fatalf("version 3 read %+v, %v; want %+v", got, err, id)
	}
	got, err = ReadIdentity(bytes.NewReader(v2.Bytes()), VersionNotices-1)
	if want := (Identity{HasState: true, Domain: "d1", Applied: 42}); err != nil || got != want {
		t.Fatalf("version 2 read %+v, %v; want %+v", got, err, want)
	}
	// A reader of one version refuses the other's layout instead of
	// misreading it.
	if _, err := ReadIdentity(bytes.NewReader(v3.Bytes()), VersionNotices-1); !errors.Is(err, ErrMalformed) {
		t.Fatalf("version 2 reader of a version 3 identity: %v", err)
	}
	if _, err := ReadIdentity(bytes.NewReader(v2.Bytes()), VersionNotices); !errors.Is(err, ErrMalformed) {
		t.Fatalf("version 3 reader of a version 2 identity: %v", err)
	}
}
