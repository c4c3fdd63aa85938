// Package client is the low-level client of a node's client port: one
// authenticated, pipelined TCP connection that sends requests and matches
// replies by id (cluster/PROTOCOL.md, "Response matching rules"). It does not
// follow M, reconnect or retry: that is sidecar.Broker's job, built on it.
package client

import (
	"context"
	"net"
	"time"

	"ticketing/cluster/wire"
)

// Config configures Dial.
type Config struct {
	// Secret is the client secret (the node's --secret-file content).
	Secret []byte
	// ClusterID must match the node's; "" for the default.
	ClusterID string
	// HandshakeTimeout bounds dial + handshake; zero means 5s.
	HandshakeTimeout time.Duration
	// Dialer dials TCP; nil means a net.Dialer.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Conn is one client connection. Safe for concurrent use: many goroutines may
// have requests in flight at once; replies may arrive in any order.
type Conn struct{}

// Dial connects to addr and runs the handshake.
func Dial(ctx context.Context, addr string, cfg Config) (*Conn, error) { panic("TODO") }

// Do sends m (its ID is assigned by Conn; the caller leaves it 0) and waits
// for its reply. written reports whether any byte of the request reached the
// socket: if err != nil and written is true, the outcome is unknown.
// Cancelling ctx stops the wait (the request may still run on the server);
// the error then wraps ctx.Err().
func (c *Conn) Do(ctx context.Context, m wire.Msg) (reply wire.Msg, written bool, err error) { panic("TODO") }

// Call is one request in flight.
type Call struct {
	// ID is the request id Conn assigned (usable as a TypeCancel target).
	ID uint64
	// Done is closed when Reply/Err are set.
	Done <-chan struct{}
	// Reply is the matched reply (valid after Done, when Err is nil).
	Reply wire.Msg
	// Err is set if the connection died before the reply arrived.
	Err error
	// Written reports whether any byte of the request reached the socket.
	Written bool
}

// Start sends m without waiting (m.ID must be 0; Conn assigns it).
func (c *Conn) Start(m wire.Msg) (*Call, error) { panic("TODO") }

// Close closes the connection; calls waiting in Do return an error.
func (c *Conn) Close() error { panic("TODO") }

// Done is closed when the connection is dead (closed by either side).
func (c *Conn) Done() <-chan struct{} { panic("TODO") }
