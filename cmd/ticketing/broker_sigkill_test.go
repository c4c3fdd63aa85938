package main

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"ticketing/cluster/localproc"
	"ticketing/cluster/wire"
	"ticketing/sidecar"
)

// The leader process is SIGKILLed while an acquire waits there: a broker
// without a cluster session (sessions off, as a broker of version 6)
// reports Indeterminate (never a grant that is then lost), keeps serving
// through the new leader, and the holder's release succeeds there.
// TestBrokerLeaderSIGKILLKeepsSessionWaiter is the same with a session.
func TestBrokerLeaderSIGKILLDuringPendingAcquire(t *testing.T) {
	p, b, ctx := procsAndBroker(t, "warn", func(cfg *sidecar.Config) { cfg.Sessions = sidecar.SessionsOff })
	_, err := p.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Setup: an M is a definite "not executed" (the leader may have changed
	// since p.Leader looked; one naming no leader is ErrUnavailable), so
	// the caller may ask again.
	var held sidecar.Lock
	for {
		held, err = b.Acquire(ctx, "seats", "holder", 60*time.Second, 0)
		if !errors.Is(err, sidecar.ErrMoved) && !errors.Is(err, sidecar.ErrUnavailable) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	li, err := p.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, "seats", "waiter", 60*time.Second, 30*time.Second)
		errc <- err
	}()
	waitOneQueued(ctx, t, p, li)
	if err := p.Signal(li, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, sidecar.ErrIndeterminate) {
		t.Fatalf("pending acquire at a SIGKILLed leader: %v, want ErrIndeterminate", err)
	}
	if err := b.Release(ctx, held); err != nil {
		t.Fatalf("holder's release on the new leader: %v", err)
	}
	// The waiter was dropped by the new leader, so the key is free, not
	// held by a waiter nobody listens to.
	ni, err := p.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Status(ctx, ni)
	if err != nil || st.Type != wire.TypeStatusR || st.Held != 0 || st.Waiting != 0 {
		t.Fatalf("after failover: %+v %v, want nothing held or waiting", st, err)
	}
	if _, err := b.Acquire(ctx, "seats", "next", 10*time.Second, 0); err != nil {
		t.Fatalf("acquire after failover: %v", err)
	}
}

// The leader process is SIGKILLed while an acquire waits there, with the
// broker's cluster session (the default): the waiter keeps its place, the
// broker resumes the session on the new leader, and the waiter is granted
// there once the holder releases (a definite outcome, not Indeterminate).
func TestBrokerLeaderSIGKILLKeepsSessionWaiter(t *testing.T) {
	p, b, ctx := procsAndBroker(t, "warn")
	var held sidecar.Lock
	var err error
	for {
		held, err = b.Acquire(ctx, "seats", "holder", 60*time.Second, 0)
		if !errors.Is(err, sidecar.ErrMoved) && !errors.Is(err, sidecar.ErrUnavailable) {
			break // M or no serving leader: definite, not executed
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if si := b.Info().Session; si == nil || si.State != "attached" {
		t.Fatalf("the broker's session: %+v", si)
	}
	li, err := p.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		lk  sidecar.Lock
		err error
	}
	out := make(chan res, 1)
	go func() {
		lk, err := b.Acquire(ctx, "seats", "waiter", 60*time.Second, 40*time.Second)
		out <- res{lk, err}
	}()
	waitOneQueued(ctx, t, p, li)
	resumes := b.Info().Session.Resumes
	if err := p.Signal(li, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for {
		if si := b.Info().Session; si != nil && si.State == "attached" && si.Resumes > resumes {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the session never resumed: %+v", b.Info().Session)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := b.Release(ctx, held); err != nil {
		t.Fatalf("holder's release on the new leader: %v", err)
	}
	r := <-out
	if r.err != nil || r.lk.Token <= held.Token {
		t.Fatalf("the waiter after the SIGKILL: %+v %v, want granted with a token above %d", r.lk, r.err, held.Token)
	}
	if err := b.Release(ctx, r.lk); err != nil {
		t.Fatalf("waiter's release: %v", err)
	}
}

// procsAndBroker starts 3 node processes (logging at level) and a Broker
// on them (its config adjusted by tune); both are closed when the test
// ends, as is the returned context (60 s).
// waitOneQueued waits until node li (the leader) has one waiter queued.
func waitOneQueued(ctx context.Context, t *testing.T, p *localproc.Procs, li int) {
	t.Helper()
	for {
		st, err := p.Status(ctx, li)
		if err == nil && st.Waiting == 1 {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("waiter never queued")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func procsAndBroker(t *testing.T, level string, tune ...func(*sidecar.Config)) (*localproc.Procs, *sidecar.Broker, context.Context) {
	t.Helper()
	p, err := localproc.Start(localproc.Options{Binary: binary, Dir: t.TempDir(),
		ExtraArgs: []string{"--log-level", level}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	b := procsBroker(t, p, tune...)
	return p, b, ctx
}

// procsBroker is an in-process Broker on the node processes p, closed at
// the end of the test.
func procsBroker(t *testing.T, p *localproc.Procs, tune ...func(*sidecar.Config)) *sidecar.Broker {
	t.Helper()
	cfg := sidecar.DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.ClusterID = p.ClientAddrs(), p.ClientSecret, p.ClusterID
	for _, f := range tune {
		f(&cfg)
	}
	b, err := sidecar.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}
