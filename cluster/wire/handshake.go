package wire

import "io"

// ConnKind says which secret and which checks a handshake uses.
type ConnKind uint8

const (
	KindClient ConnKind = 1 // a client (sidecar, tool) on a node's client port
	KindPeer   ConnKind = 2 // a Raft peer on a node's peer port
)

// HandshakeConfig is one side's view of a handshake.
//
// Payloads (TODO(helper): keep identical to cluster/PROTOCOL.md):
//
//	Hello     'h': magic "TKTG" | min_version u16 | max_version u16 | kind u8 |
//	               client_nonce [32] | cluster_id str8 | sender_id str8 | expect_id str8
//	Challenge 'C': version u16 | server_nonce [32] | server_id str8 | cluster_id str8 | server_proof [32]
//	Auth      'x': client_proof [32]
//	Welcome   'W': (empty)
//
// transcript = version u16 | kind u8 | client_nonce | server_nonce |
// str8 cluster_id | str8 server_id | str8 sender_id | str8 expect_id |
// str8 channel_binding (empty without TLS)
// server_proof = HMAC-SHA256(secret, "ticketing/server/v1" 0x00 transcript)
// client_proof = HMAC-SHA256(secret, "ticketing/client/v1" 0x00 transcript)
// Proofs are compared in constant time. The client checks server_proof (and,
// for peers, server_id == expect_id) before it sends its own proof, so a fake
// node learns nothing. Any failure: the side that detects it sends a
// TypeError frame with id 0 and the matching code, when it can, and closes.
type HandshakeConfig struct {
	// Kind selects client or peer rules.
	Kind ConnKind
	// Secret is the shared secret for Kind. Required, at least 16 bytes.
	Secret []byte
	// ClusterID must match on both sides ("" matches only "").
	ClusterID string
	// NodeID is this side's node id: on a server, the accepting node; on a
	// peer dialler, the dialling node (proven by the client proof). Clients
	// leave it empty.
	NodeID string
	// ExpectNodeID (dialler only): the node id the dialler expects to reach;
	// "" accepts any (clients). Peers always set it: hashicorp/raft counts a
	// vote under the id it dialled, so the answering node must prove it.
	ExpectNodeID string
	// ChannelBinding is mixed into both proofs when non-empty (a TLS
	// exporter value, so a relayed answer is useless). Empty without TLS.
	ChannelBinding []byte
	// Rand supplies nonces; nil means crypto/rand.
	Rand io.Reader
}

// Peer is what a finished handshake learned about the other side.
type Peer struct {
	Version   uint16
	NodeID    string // server side: the dialler's sender_id; client side: server_id
	ClusterID string
}

// NonceLen is the size of each side's nonce.
const NonceLen = 32

// ClientHandshake runs the dialler's side on rw (a fresh connection, deadline
// set by the caller). Both handshake functions read exactly the handshake's
// frames from rw and never more, so the caller can wrap rw in its own
// buffered reader afterwards.
func ClientHandshake(rw io.ReadWriter, cfg HandshakeConfig) (Peer, error) { panic("TODO") }

// ServerHandshake runs the accepting side on rw.
func ServerHandshake(rw io.ReadWriter, cfg HandshakeConfig) (Peer, error) { panic("TODO") }
