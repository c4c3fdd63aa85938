package wire

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// ConnKind says which secret and which checks a handshake uses.
type ConnKind uint8

const (
	KindClient ConnKind = 1 // a client (sidecar, tool) on a node's client port
	KindPeer   ConnKind = 2 // a Raft peer on a node's peer port
	// KindDiscover: a node at its first start asking a peer, on the peer
	// port with the peer secret, for its full server id and whether it has
	// Raft state. expect_id may name the bare node name. After the Welcome
	// the server sends one Identity frame and closes.
	KindDiscover ConnKind = 3
	// KindAdmin: an operator tool on a node's admin port, with the admin
	// secret (membership changes; see admin.go).
	KindAdmin ConnKind = 4
)

// HandshakeConfig is one side's view of a handshake.
//
// Payloads (identical to PROTOCOL.md, "Handshake"):
//
//	Hello     'h': magic "TKTG" | min_version u16 | max_version u16 | kind u8 |
//	               client_nonce [32] | cluster_id str8 | sender_id str8 | expect_id str8 |
//	               domain str8
//	Challenge 'C': version u16 | server_nonce [32] | server_id str8 | cluster_id str8 |
//	               domain str8 | n u8 (1..2) | n × server_proof [32]
//	Auth      'x': client_proof [32]
//	Welcome   'W': (empty before version 4)
//	               max_in_flight u32 | max_waiters u32 (version 4 on)
//
// transcript = version u16 | kind u8 | client_nonce | server_nonce |
// str8 cluster_id | str8 server_id | str8 sender_id | str8 expect_id |
// str8 hello_domain | str8 challenge_domain |
// str8 channel_binding (empty without TLS)
// server_proof = HMAC-SHA256(secret, "ticketing/server/v1" 0x00 transcript)
// client_proof = HMAC-SHA256(secret, "ticketing/client/v1" 0x00 transcript)
// The server sends one server_proof per secret it accepts (two during a
// secret rollover); the client answers with the secret whose proof matched.
// Proofs are compared in constant time. The client checks server_proof (and,
// for peers, server_id == expect_id) before it sends its own proof, so a fake
// node learns nothing. Any failure: the side that detects it sends a
// TypeError frame with id 0 and the matching code, when it can, and closes.
type HandshakeConfig struct {
	// Kind selects client or peer rules.
	Kind ConnKind
	// Secret is the shared secret for Kind. Required, at least 16 bytes.
	Secret []byte
	// NextSecret, when set, is a second accepted secret during a rollover
	// (at least 16 bytes). A server proves itself with both and accepts a
	// client proof made with either; a client whose Secret does not match
	// tries NextSecret. Rollover: give every node the new secret as
	// NextSecret, move the clients (or peers) to it, then make it Secret.
	NextSecret []byte
	// ClusterID must match on both sides ("" matches only "").
	ClusterID string
	// Domain is the fencing domain: a server's own ("" while it does not
	// know one), a dialler's expected one ("" accepts any). When both
	// sides name one and they differ, the handshake fails (wrong_domain):
	// tokens of two domains are not comparable.
	Domain string
	// NodeID is this side's node id: on a server, the accepting node; on a
	// peer dialler, the dialling node (proven by the client proof). Clients
	// leave it empty.
	NodeID string
	// NodeName (server only, peer port): the bare node name a KindDiscover
	// dialler may expect instead of NodeID ("n1" for "n1/abcdefghij").
	NodeName string
	// ExpectNodeID (dialler only): the node id the dialler expects to reach;
	// "" accepts any (clients). Peers always set it: hashicorp/raft counts a
	// vote under the id it dialled, so the answering node must prove it.
	ExpectNodeID string
	// ChannelBinding is mixed into both proofs when non-empty: the TLS
	// exporter value of the connection (see ExporterLabel), so an answer
	// relayed between two TLS sessions does not verify. Empty without TLS.
	ChannelBinding []byte
	// Rand supplies nonces; nil means crypto/rand.
	Rand io.Reader
	// MaxInFlight and MaxWaiters (server only) are the node's
	// per-connection limits, told to the dialler in a version 4 Welcome:
	// the acquires (and, separately, the releases) one connection may
	// have owed before their own command is applied, and the waiting
	// acquires (queued, or with a wait and not applied yet) it may have.
	// 0 = not told (peer and admin ports, which have no such limits).
	// At most math.MaxUint32; ignored by a dialler.
	MaxInFlight, MaxWaiters int
	// MaxVersion is the newest version to offer (dialler) or accept
	// (server): MinProtocolVersion..NewestProtocolVersion, 0 =
	// ProtocolVersion. Tests and tools play an older client or node with
	// it; a version above ProtocolVersion (one being built, when there is
	// one: NewestProtocolVersion) is spoken only where it is set so.
	MaxVersion uint16
}

// Peer is what a finished handshake learned about the other side.
type Peer struct {
	Kind      ConnKind
	Domain    string // the other side's fencing domain ("" if it named none)
	Version   uint16
	NodeID    string // server side: the dialler's sender_id; client side: server_id
	ClusterID string
	// MaxInFlight and MaxWaiters (client side) are the node's
	// per-connection limits from its Welcome (HandshakeConfig.MaxInFlight,
	// MaxWaiters); 0 = not told (a version 2 or 3 node, or a port without
	// such limits). Zero on the server side.
	MaxInFlight, MaxWaiters int
}

// NonceLen is the size of each side's nonce.
const NonceLen = 32

// MinProtocolVersion is the oldest version this build still speaks.
// Version 1 carried exactly one server proof; it was never released.
const MinProtocolVersion = 2

// ExporterLabel is the TLS exporter label (RFC 5705/8446 section 7.5) whose
// 32-byte output is the handshake's channel binding on a TLS connection,
// with an empty context.
const ExporterLabel = "EXPORTER-ticketing-channel-binding"

// ChannelBindingLen is the length of the exporter output used as binding.
const ChannelBindingLen = 32

// maxServerProofs bounds the proofs in a Challenge: the current secret and
// the next one during a rollover.
const maxServerProofs = 2

// MinSecretLen is the shortest secret HandshakeConfig accepts: HMAC keys
// shorter than this are guessable offline from one recorded handshake.
const MinSecretLen = 16

// Magic opens every Hello, so a node can tell a Ticketing dialler from a
// stray connection at its first bytes.
const Magic = "TKTG"

// Proof labels: distinct per direction, so a server proof can never be
// replayed as a client proof (or vice versa) for the same transcript.
const (
	serverLabel = "ticketing/server/v1"
	clientLabel = "ticketing/client/v1"
)

const proofLen = sha256.Size

// ClientHandshake runs the dialler's side on rw (a fresh connection, deadline
// set by the caller). Both handshake functions read exactly the handshake's
// frames from rw and never more, so the caller can wrap rw in its own
// buffered reader afterwards. It never sleeps: pacing failed attempts is the
// caller's job.
//
// The client checks the Challenge (version within its range, cluster id,
// server proof, and server_id == ExpectNodeID when that is set) before it
// sends its own proof, so an impostor learns nothing it could replay.
// Errors wrap ErrAuthFailed, ErrVersion, ErrWrongNode, ErrWrongCluster,
// ErrMalformed, ErrUnexpectedFrame, ErrBadConfig, the sentinel of an error
// code the server sent, or an I/O error.
func ClientHandshake(rw io.ReadWriter, cfg HandshakeConfig) (Peer, error) {
	maxV := uint16(ProtocolVersion)
	if cfg.MaxVersion != 0 {
		maxV = cfg.MaxVersion
	}
	return clientHandshake(rw, cfg, MinProtocolVersion, maxV)
}

// clientHandshake takes the version range as parameters so that tests can
// play an older or newer client.
func clientHandshake(rw io.ReadWriter, cfg HandshakeConfig, minV, maxV uint16) (Peer, error) {
	if err := cfg.check(true); err != nil {
		return Peer{}, err
	}
	var cn [NonceLen]byte
	if err := readNonce(cfg.Rand, cn[:]); err != nil {
		return Peer{}, err
	}
	hello := make([]byte, 0, 64+3*256)
	hello = append(hello, 0, 0, 0, 0, TypeHello)
	hello = append(hello, Magic...)
	hello = binary.BigEndian.AppendUint16(hello, minV)
	hello = binary.BigEndian.AppendUint16(hello, maxV)
	hello = append(hello, byte(cfg.Kind))
	hello = append(hello, cn[:]...)
	hello = appendStr8(hello, cfg.ClusterID)
	hello = appendStr8(hello, cfg.NodeID)
	hello = appendStr8(hello, cfg.ExpectNodeID)
	hello = appendStr8(hello, cfg.Domain)
	if _, err := rw.Write(finishFrame(hello)); err != nil {
		return Peer{}, fmt.Errorf("wire: handshake: sending hello: %w", err)
	}

	buf := make([]byte, MaxFrameBytes)
	typ, payload, err := readFrameExact(rw, buf)
	if err != nil {
		return Peer{}, fmt.Errorf("wire: handshake: reading challenge: %w", err)
	}
	switch typ {
	case TypeChallenge:
	case TypeError:
		return Peer{}, remoteError(payload, "server")
	default:
		return Peer{}, fail(rw, CodeUnexpectedFrame, fmt.Errorf("%w: %s instead of challenge", ErrUnexpectedFrame, TypeName(typ)))
	}
	d := decoder{b: payload}
	version := d.u16()
	sn := d.take(NonceLen)
	serverID := d.str8()
	clusterID := d.str8()
	serverDomain := d.str8()
	nproofs := int(d.u8())
	var serverProofs [maxServerProofs][]byte
	for i := 0; i < nproofs && i < maxServerProofs; i++ {
		serverProofs[i] = d.take(proofLen)
	}
	if !d.done() || nproofs < 1 || nproofs > maxServerProofs {
		return Peer{}, fail(rw, CodeBadRequest, malformed(typ, "bad challenge payload", payload))
	}
	if version < minV || version > maxV {
		return Peer{}, fail(rw, CodeVersion, fmt.Errorf("%w: server chose %d, client speaks %d..%d", ErrVersion, version, minV, maxV))
	}
	if clusterID != cfg.ClusterID {
		return Peer{}, fail(rw, CodeWrongCluster, fmt.Errorf("%w: server is in cluster %q, expected %q", ErrWrongCluster, clusterID, cfg.ClusterID))
	}
	if cfg.Domain != "" && serverDomain != "" && serverDomain != cfg.Domain {
		return Peer{}, fail(rw, CodeWrongDomain, fmt.Errorf("%w: server is in fencing domain %q, expected %q", ErrWrongDomain, serverDomain, cfg.Domain))
	}
	t := transcript(version, cfg.Kind, cn[:], sn, clusterID, serverID, cfg.NodeID, cfg.ExpectNodeID, cfg.Domain, serverDomain, cfg.ChannelBinding)
	// Every proof is checked against every secret (constant time each), so
	// the time taken does not say which one matched.
	var secret []byte
	for _, s := range cfg.secrets() {
		want := proof(s, serverLabel, t)
		for _, p := range serverProofs[:nproofs] {
			if hmac.Equal(p, want) && secret == nil {
				secret = s
			}
		}
	}
	if secret == nil {
		return Peer{}, fail(rw, CodeAuthFailed, fmt.Errorf("%w: server proof does not match (wrong secret, impostor, or a relayed TLS session)", ErrAuthFailed))
	}
	// The server refuses a wrong expect_id itself; checking again here
	// (now that server_id is proven) guards against a server that does not.
	// A discovering node knows only the name: "NAME" matches "NAME/INC".
	byName := cfg.Kind == KindDiscover && strings.HasPrefix(serverID, cfg.ExpectNodeID+"/")
	if cfg.ExpectNodeID != "" && serverID != cfg.ExpectNodeID && !byName {
		return Peer{}, fail(rw, CodeWrongNode, fmt.Errorf("%w: reached %q, expected %q", ErrWrongNode, serverID, cfg.ExpectNodeID))
	}

	auth := append(buf[:0], 0, 0, 0, 0, TypeAuth)
	auth = append(auth, proof(secret, clientLabel, t)...)
	if _, err := rw.Write(finishFrame(auth)); err != nil {
		return Peer{}, fmt.Errorf("wire: handshake: sending auth: %w", err)
	}
	typ, payload, err = readFrameExact(rw, buf)
	if err != nil {
		return Peer{}, fmt.Errorf("wire: handshake: reading welcome: %w", err)
	}
	switch {
	case typ == TypeError:
		return Peer{}, remoteError(payload, "server")
	case typ != TypeWelcome:
		return Peer{}, fail(rw, CodeUnexpectedFrame, fmt.Errorf("%w: %s instead of welcome", ErrUnexpectedFrame, TypeName(typ)))
	case len(payload) != welcomeLen(version):
		return Peer{}, fail(rw, CodeBadRequest, malformed(typ, "welcome payload is not "+strconv.Itoa(welcomeLen(version))+" bytes for version "+strconv.Itoa(int(version)), payload))
	}
	p := Peer{Version: version, NodeID: serverID, ClusterID: clusterID, Domain: serverDomain}
	if version >= VersionQueued {
		p.MaxInFlight = int(binary.BigEndian.Uint32(payload))
		p.MaxWaiters = int(binary.BigEndian.Uint32(payload[4:]))
	}
	return p, nil
}

// welcomeLen is the Welcome's payload length in version: empty before
// VersionQueued, then max_in_flight u32 | max_waiters u32.
func welcomeLen(version uint16) int {
	if version >= VersionQueued {
		return 8
	}
	return 0
}

// ServerHandshake runs the accepting side on rw.
//
// It picks the highest version both sides speak, then checks kind, cluster
// id and (for peers, or any dialler that names one) expect_id against its
// NodeID before it spends a nonce, and finally the client proof. Every
// refusal is answered with a TypeError (id 0) carrying the matching code,
// then the error is returned; the caller closes the connection. Errors wrap
// the same sentinels as ClientHandshake's.
func ServerHandshake(rw io.ReadWriter, cfg HandshakeConfig) (Peer, error) {
	newest := uint16(ProtocolVersion)
	if cfg.MaxVersion != 0 {
		newest = cfg.MaxVersion
	}
	return serverHandshake(rw, cfg, newest)
}

// serverHandshake takes the newest version as a parameter so that tests
// can play an older node.
func serverHandshake(rw io.ReadWriter, cfg HandshakeConfig, newest uint16) (Peer, error) {
	if err := cfg.check(false); err != nil {
		return Peer{}, err
	}
	buf := make([]byte, MaxFrameBytes)
	typ, payload, err := readFrameExact(rw, buf)
	if err != nil {
		if errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrMalformed) {
			return Peer{}, fail(rw, CodeOf(err), fmt.Errorf("wire: handshake: reading hello: %w", err))
		}
		return Peer{}, fmt.Errorf("wire: handshake: reading hello: %w", err)
	}
	if typ != TypeHello {
		return Peer{}, fail(rw, CodeUnexpectedFrame, fmt.Errorf("%w: %s instead of hello (payload %s)", ErrUnexpectedFrame, TypeName(typ), Snippet(payload)))
	}
	d := decoder{b: payload}
	magic := d.take(len(Magic))
	minV := d.u16()
	maxV := d.u16()
	// The version range comes before anything whose layout may differ
	// between versions: a client of another version gets "version", not
	// "malformed", whatever the rest of its Hello looks like.
	version := min(maxV, newest)
	if !d.fail && string(magic) == Magic && (minV > maxV || version < minV || version < MinProtocolVersion) {
		return Peer{}, fail(rw, CodeVersion, fmt.Errorf("%w: client speaks %d..%d, server %d..%d", ErrVersion, minV, maxV, MinProtocolVersion, newest))
	}
	kind := ConnKind(d.u8())
	cn := d.take(NonceLen)
	clusterID := d.str8()
	senderID := d.str8()
	expectID := d.str8()
	helloDomain := d.str8()
	if !d.done() || string(magic) != Magic {
		return Peer{}, fail(rw, CodeBadRequest, malformed(typ, "bad hello payload", payload))
	}
	if kind != cfg.Kind && !(cfg.Kind == KindPeer && kind == KindDiscover) {
		return Peer{}, fail(rw, CodeBadRequest, fmt.Errorf("%w: connection kind %d on a port for kind %d", ErrMalformed, kind, cfg.Kind))
	}
	if clusterID != cfg.ClusterID {
		return Peer{}, fail(rw, CodeWrongCluster, fmt.Errorf("%w: dialler is in cluster %q, this node in %q", ErrWrongCluster, clusterID, cfg.ClusterID))
	}
	if helloDomain != "" && cfg.Domain != "" && helloDomain != cfg.Domain {
		return Peer{}, fail(rw, CodeWrongDomain, fmt.Errorf("%w: dialler is in fencing domain %q, this node in %q", ErrWrongDomain, helloDomain, cfg.Domain))
	}
	discoverByName := kind == KindDiscover && cfg.NodeName != "" && expectID == cfg.NodeName
	if (kind == KindPeer || kind == KindDiscover || expectID != "") && expectID != cfg.NodeID && !discoverByName {
		return Peer{}, fail(rw, CodeWrongNode, fmt.Errorf("%w: dialler expects %q, this node is %q", ErrWrongNode, expectID, cfg.NodeID))
	}

	var sn [NonceLen]byte
	if err := readNonce(cfg.Rand, sn[:]); err != nil {
		return Peer{}, fail(rw, CodeInternal, err)
	}
	t := transcript(version, kind, cn, sn[:], clusterID, cfg.NodeID, senderID, expectID, helloDomain, cfg.Domain, cfg.ChannelBinding)
	ch := make([]byte, 0, 128+len(cfg.NodeID)+len(cfg.ClusterID))
	ch = append(ch, 0, 0, 0, 0, TypeChallenge)
	ch = binary.BigEndian.AppendUint16(ch, version)
	ch = append(ch, sn[:]...)
	ch = appendStr8(ch, cfg.NodeID)
	ch = appendStr8(ch, cfg.ClusterID)
	ch = appendStr8(ch, cfg.Domain)
	secrets := cfg.secrets()
	ch = append(ch, byte(len(secrets)))
	for _, s := range secrets {
		ch = append(ch, proof(s, serverLabel, t)...)
	}
	if _, err := rw.Write(finishFrame(ch)); err != nil {
		return Peer{}, fmt.Errorf("wire: handshake: sending challenge: %w", err)
	}

	typ, payload, err = readFrameExact(rw, buf)
	if err != nil {
		if errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrMalformed) {
			return Peer{}, fail(rw, CodeOf(err), fmt.Errorf("wire: handshake: reading auth: %w", err))
		}
		return Peer{}, fmt.Errorf("wire: handshake: reading auth: %w", err)
	}
	switch {
	case typ == TypeError:
		return Peer{}, remoteError(payload, "client")
	case typ != TypeAuth:
		return Peer{}, fail(rw, CodeUnexpectedFrame, fmt.Errorf("%w: %s instead of auth", ErrUnexpectedFrame, TypeName(typ)))
	case len(payload) != proofLen:
		return Peer{}, fail(rw, CodeBadRequest, malformed(typ, "auth payload is not "+strconv.Itoa(proofLen)+" bytes", payload))
	}
	ok := 0
	for _, s := range secrets {
		ok |= subtle.ConstantTimeCompare(payload, proof(s, clientLabel, t))
	}
	if ok != 1 {
		return Peer{}, fail(rw, CodeAuthFailed, fmt.Errorf("%w: client proof does not match (wrong secret or a relayed TLS session)", ErrAuthFailed))
	}
	w := append(buf[:0], 0, 0, 0, 0, TypeWelcome)
	if version >= VersionQueued {
		w = binary.BigEndian.AppendUint32(w, uint32(cfg.MaxInFlight))
		w = binary.BigEndian.AppendUint32(w, uint32(cfg.MaxWaiters))
	}
	if _, err := rw.Write(finishFrame(w)); err != nil {
		return Peer{}, fmt.Errorf("wire: handshake: sending welcome: %w", err)
	}
	return Peer{Kind: kind, Version: version, NodeID: senderID, ClusterID: clusterID, Domain: helloDomain}, nil
}

// check validates cfg before any I/O; dialler says which side uses it.
func (cfg *HandshakeConfig) check(dialler bool) error {
	switch {
	case cfg.Kind != KindClient && cfg.Kind != KindPeer && cfg.Kind != KindAdmin && !(dialler && cfg.Kind == KindDiscover):
		return fmt.Errorf("%w: kind %d", ErrBadConfig, cfg.Kind)
	case len(cfg.Secret) < MinSecretLen:
		return fmt.Errorf("%w: secret is %d bytes, need at least %d", ErrBadConfig, len(cfg.Secret), MinSecretLen)
	case cfg.NextSecret != nil && len(cfg.NextSecret) < MinSecretLen:
		return fmt.Errorf("%w: next secret is %d bytes, need at least %d", ErrBadConfig, len(cfg.NextSecret), MinSecretLen)
	case cfg.MaxVersion != 0 && (cfg.MaxVersion < MinProtocolVersion || cfg.MaxVersion > NewestProtocolVersion):
		return fmt.Errorf("%w: max version %d not in %d..%d", ErrBadConfig, cfg.MaxVersion, MinProtocolVersion, NewestProtocolVersion)
	case cfg.MaxInFlight < 0 || cfg.MaxWaiters < 0 || uint64(cfg.MaxInFlight) > math.MaxUint32 || uint64(cfg.MaxWaiters) > math.MaxUint32:
		return fmt.Errorf("%w: limits %d, %d not in 0..%d", ErrBadConfig, cfg.MaxInFlight, cfg.MaxWaiters, uint32(math.MaxUint32))
	case len(cfg.ClusterID) > 255 || len(cfg.Domain) > 255 || len(cfg.NodeID) > 255 || len(cfg.ExpectNodeID) > 255 || len(cfg.ChannelBinding) > 255:
		return fmt.Errorf("%w: an id or the channel binding is longer than 255 bytes", ErrBadConfig)
	case dialler && (cfg.Kind == KindPeer || cfg.Kind == KindDiscover) && (cfg.NodeID == "" || cfg.ExpectNodeID == ""):
		return fmt.Errorf("%w: a peer dialler needs NodeID and ExpectNodeID", ErrBadConfig)
	case !dialler && cfg.Kind == KindPeer && cfg.NodeID == "":
		return fmt.Errorf("%w: a peer server needs NodeID", ErrBadConfig)
	}
	return nil
}

// secrets lists the accepted secrets, current first.
func (cfg *HandshakeConfig) secrets() [][]byte {
	if cfg.NextSecret != nil {
		return [][]byte{cfg.Secret, cfg.NextSecret}
	}
	return [][]byte{cfg.Secret}
}

func readNonce(r io.Reader, b []byte) error {
	if r == nil {
		r = rand.Reader
	}
	if _, err := io.ReadFull(r, b); err != nil {
		return fmt.Errorf("wire: handshake: reading nonce: %w", err)
	}
	return nil
}

// finishFrame fills the length prefix of a frame built after 4 zero bytes.
func finishFrame(b []byte) []byte {
	binary.BigEndian.PutUint32(b, uint32(len(b)-headerLen))
	return b
}

// readFrameExact reads one frame with io.ReadFull, never past its end, so
// the bytes after the handshake stay in the connection for the caller's
// buffered reader. buf must hold MaxFrameBytes.
func readFrameExact(r io.Reader, buf []byte) (typ byte, payload []byte, err error) {
	if _, err := io.ReadFull(r, buf[:headerLen]); err != nil {
		return 0, nil, err
	}
	if _, _, _, err := SplitFrame(buf[:headerLen]); err != nil {
		return 0, nil, err
	}
	n := headerLen + int(binary.BigEndian.Uint32(buf))
	if _, err := io.ReadFull(r, buf[headerLen:n]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return buf[headerLen], buf[headerLen+1 : n], nil
}

// transcript is the byte string both proofs sign: everything either side
// said that matters, so no field can be swapped without breaking a proof.
func transcript(version uint16, kind ConnKind, cn, sn []byte, clusterID, serverID, senderID, expectID, helloDomain, serverDomain string, binding []byte) []byte {
	t := make([]byte, 0, 3+2*NonceLen+5+len(clusterID)+len(serverID)+len(senderID)+len(expectID)+len(binding))
	t = binary.BigEndian.AppendUint16(t, version)
	t = append(t, byte(kind))
	t = append(t, cn...)
	t = append(t, sn...)
	t = appendStr8(t, clusterID)
	t = appendStr8(t, serverID)
	t = appendStr8(t, senderID)
	t = appendStr8(t, expectID)
	t = appendStr8(t, helloDomain)
	t = appendStr8(t, serverDomain)
	t = append(t, byte(len(binding)))
	t = append(t, binding...)
	return t
}

// proof is HMAC-SHA256(secret, label 0x00 transcript).
func proof(secret []byte, label string, t []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(label))
	h.Write([]byte{0})
	h.Write(t)
	return h.Sum(nil)
}

// fail sends a connection-level TypeError (id 0) with code and a short
// text, ignoring write errors (the connection is being abandoned anyway),
// and returns err.
func fail(w io.Writer, code Code, err error) error {
	text := err.Error()
	if len(text) > 200 {
		text = text[:200]
	}
	if b, e := AppendMsg(nil, &Msg{Type: TypeError, Code: code, Text: text}); e == nil {
		_, _ = w.Write(b)
	}
	return err
}

// remoteError turns a TypeError received during the handshake into an error
// wrapping the code's sentinel.
func remoteError(payload []byte, side string) error {
	var m Msg
	if err := DecodeMsg(TypeError, payload, &m); err != nil {
		return fmt.Errorf("wire: handshake: bad error frame from %s: %w", side, err)
	}
	text := m.Text
	if len(text) > 200 {
		text = text[:200]
	}
	return fmt.Errorf("wire: handshake refused by %s (%s): %w: %q", side, m.Code, ErrOf(m.Code), text)
}

// Identity is what a node tells a KindDiscover dialler after the handshake
// (the server id itself was proven in the Challenge).
//
//	Identity 'I': flags u8 (bit 0: has Raft state) | domain str8 | applied u64
//	              | client_addr str8 (from version 3)
//
// The layout depends on the version the handshake negotiated: a version 2
// dialler gets (and a version 2 node sends) no client_addr.
type Identity struct {
	HasState bool
	Domain   string // the fencing domain, "" if not known yet
	Applied  uint64 // the node's last applied Raft index (a leader measures a learner's lag with it)
	// ClientAddr is the client address the node advertises (from version
	// 3; "" from an older node): the leader records it in the log, so that
	// every member's address is known to clients (members reply).
	ClientAddr string
}

// WriteIdentity sends id as an Identity frame in the layout of version
// (the one the discovery handshake negotiated).
func WriteIdentity(w io.Writer, id Identity, version uint16) error {
	b := []byte{0, 0, 0, 0, TypeIdentity, 0}
	if id.HasState {
		b[5] = 1
	}
	if len(id.Domain) > 255 || len(id.ClientAddr) > 255 {
		return fmt.Errorf("%w: domain or client address longer than 255 bytes", ErrBadConfig)
	}
	b = appendStr8(b, id.Domain)
	b = binary.BigEndian.AppendUint64(b, id.Applied)
	if version >= VersionNotices {
		b = appendStr8(b, id.ClientAddr)
	}
	_, err := w.Write(finishFrame(b))
	return err
}

// ReadIdentity reads the Identity frame that follows a KindDiscover
// handshake that negotiated version.
func ReadIdentity(r io.Reader, version uint16) (Identity, error) {
	buf := make([]byte, 1024)
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Identity{}, err
	}
	n := int(binary.BigEndian.Uint32(h[:]))
	if n < 1 || n > len(buf) {
		return Identity{}, fmt.Errorf("%w: identity frame of %d bytes", ErrMalformed, n)
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return Identity{}, err
	}
	if buf[0] != TypeIdentity {
		if buf[0] == TypeError {
			return Identity{}, remoteError(buf[1:n], "server")
		}
		return Identity{}, fmt.Errorf("%w: %s instead of identity", ErrUnexpectedFrame, TypeName(buf[0]))
	}
	d := decoder{b: buf[1:n]}
	flags := d.u8()
	domain := d.str8()
	applied := d.u64()
	var addr string
	if version >= VersionNotices {
		addr = d.str8()
	}
	if !d.done() || flags > 1 {
		return Identity{}, malformed(TypeIdentity, "bad identity payload", buf[1:n])
	}
	return Identity{HasState: flags == 1, Domain: domain, Applied: applied, ClientAddr: addr}, nil
}
