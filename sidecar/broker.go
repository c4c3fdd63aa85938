package sidecar

import (
	"context"
	"log/slog"
	"time"
)

// Config configures a Broker.
type Config struct {
	// Addrs are the cluster nodes' client addresses (HOST:PORT). Required.
	Addrs []string
	// Secret is the cluster's client secret. Required (>= 16 bytes).
	Secret []byte
	// ClusterID must match the nodes'.
	ClusterID string
	// Logger; nil: slog.Default().
	Logger *slog.Logger
}

// Broker is the official client. Safe for concurrent use.
type Broker struct{}

// New starts a broker; its connections come up in the background.
func New(cfg Config) (*Broker, error) { panic("TODO") }

// Acquire asks for key on behalf of owner. lease must be whole seconds in
// 1..250 s; wait is the bound on waiting for the turn (0 = one try). It
// returns the Lock, or ErrBusy, ErrTimeout, ErrIndeterminate, ErrMoved,
// ErrUnavailable, a field error (locksm.ErrInvalidKey, ...) or an error
// wrapping ctx.Err() (not acquired; a grant that arrives later is released
// by the broker).
func (b *Broker) Acquire(ctx context.Context, key, owner string, lease, wait time.Duration) (Lock, error) {
	panic("TODO")
}

// Release releases l through the bounded release queue, retrying until 5 s
// after this call; nil only on a success reply. Otherwise a definite server
// error (locksm.ErrNotHeld, ErrTokenMismatch, ...), ErrIndeterminate, or
// ErrReleaseQueueFull.
func (b *Broker) Release(ctx context.Context, l Lock) error { panic("TODO") }

// Compensate enqueues the release of l without waiting for the outcome (for
// locks whose user went away). The outcome is logged.
func (b *Broker) Compensate(l Lock) { panic("TODO") }

// Info reports the broker's view of the cluster.
func (b *Broker) Info() Info { panic("TODO") }

// Close stops the broker and its connections.
func (b *Broker) Close() error { panic("TODO") }
