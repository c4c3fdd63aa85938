package sidecar

import (
	"context"
	"fmt"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// SetPermits defines key as a semaphore of n permits (1..locksm.MaxPermits),
// changes its n (raising it grants waiters at once; lowering it ends no
// permit), or, with n = 0, removes an idle semaphore (locksm/MATRIX.md,
// "Semaphores"). It is an operator's request, sent to the leader as a
// release is, and retried until Config.ReleaseDeadline only while no
// attempt may have run (nothing written, or an M for a written one): it
// is not exact as a release is, so a resend of one whose reply was lost
// could be answered by the state the first left (a removal's resend:
// not_semaphore) or put a stale n over a later set-permits. It returns
// nil only on a success reply. Otherwise a definite cluster error
// (locksm.ErrInUse, ErrNotSemaphore, ErrInvalidPermits,
// locksm.ErrInvalidKey; wire.ErrNotSupported before every node runs
// protocol version 13), ErrIndeterminate (written without a definite
// reply, or the deadline passed: it may have applied; read the key's
// inspect, or send it again knowing it may now apply twice), ErrClosed,
// or ctx's error (it goes on in the background).
func (b *Broker) SetPermits(ctx context.Context, key string, n uint32) error {
	ch := make(chan error, 1)
	if err := b.SetPermitsAsync(key, n, func(err error) { ch <- err }); err != nil {
		return err
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("sidecar: stopped waiting for the set-permits (it goes on until its deadline): %w", ctx.Err())
	}
}

// SetPermitsAsync starts SetPermits and returns at once; done is called
// once with the outcome, on a release worker or a connection's reader
// goroutine, and must not block. The errors returned here (done then
// never runs) are a field error and ErrClosed.
func (b *Broker) SetPermitsAsync(key string, n uint32, done func(error)) error {
	if err := locksm.ValidateKey(key); err != nil {
		return fmt.Errorf("%w: %q", err, key)
	}
	if n > locksm.MaxPermits {
		return fmt.Errorf("%w: %d (0..%d)", locksm.ErrInvalidPermits, n, locksm.MaxPermits)
	}
	job := b.newReleaseJob(Lock{Key: key}, done)
	job.setPermits, job.permits = true, n
	if b.startRelease(job) {
		return nil
	}
	return b.enqueue(job)
}

// permitsNotSupported is a permit request's definite error from a leader
// connection older than protocol version 13: never sent.
func permitsNotSupported(v uint16) error {
	return fmt.Errorf("%w: the leader speaks protocol version %d; semaphores need %d", wire.ErrNotSupported, v, wire.VersionSemaphores)
}
