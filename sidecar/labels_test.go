package sidecar

import (
	"errors"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// acquireLabelled is AcquireAsyncOpts with a label, waited for.
func acquireLabelled(t *testing.T, b *Broker, keys []string, owner, label string, wait time.Duration) (Lock, error) {
	t.Helper()
	type result struct {
		lk  Lock
		err error
	}
	ch := make(chan result, 1)
	_, err := b.AcquireAsyncOpts(keys, owner, 30*time.Second, wait, AcquireOptions{Label: label},
		func(lk Lock, err error) { ch <- result{lk, err} })
	if err != nil {
		return Lock{}, err
	}
	select {
	case r := <-ch:
		return r.lk, r.err
	case <-time.After(60 * time.Second):
		t.Fatal("no answer in 60 s")
		return Lock{}, nil
	}
}

// The broker passes a label through: sent with the acquire (one key or a
// block), kept by the cluster on the holding (every node's inspect shows
// it), and carried by the Lock. A bad label is refused before anything is
// sent (locksm.ErrInvalidLabel).
func TestBrokerLabels(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	lk, err := acquireLabelled(t, b, []string{"lab/k"}, "o1", "job-1", 0)
	if err != nil || lk.Label != "job-1" {
		t.Fatalf("acquire: %+v %v", lk, err)
	}
	blk, err := acquireLabelled(t, b, []string{"lab/b1", "lab/b2"}, "o1", "seats", 0)
	if err != nil || blk.Label != "seats" {
		t.Fatalf("block: %+v %v", blk, err)
	}
	li := leaderOf(t, c)
	for key, want := range map[string]string{"lab/k": "job-1", "lab/b2": "seats"} {
		kr, err := c.Node(li).Inspect(key)
		if err != nil || kr.Holder == nil || kr.Holder.Label != want {
			t.Fatalf("inspect %s: %v %+v", key, err, kr.Holder)
		}
	}
	for _, bad := range []string{"a b", strings.Repeat("l", locksm.MaxLabelLen+1)} {
		if _, err := acquireLabelled(t, b, []string{"lab/x"}, "o1", bad, 0); !errors.Is(err, locksm.ErrInvalidLabel) {
			t.Fatalf("label %q: %v", bad, err)
		}
	}
}

// A broker whose leader connection speaks a version before labels (7)
// answers a labelled acquire not_supported, definite, without sending it
// (never without its label); an unlabelled one is served as before.
func TestBrokerLabelsNeedVersion8(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, func(cfg *Config) { cfg.maxVersion = wire.VersionSessions })
	if _, err := acquireLabelled(t, b, []string{"lab7/k"}, "o1", "job", 0); !errors.Is(err, wire.ErrNotSupported) {
		t.Fatalf("labelled acquire on version 7: %v", err)
	}
	if kr, err := c.Node(leaderOf(t, c)).Inspect("lab7/k"); err != nil || kr.Held {
		t.Fatalf("lab7/k: %v %+v", err, kr)
	}
	if lk, err := acquireLabelled(t, b, []string{"lab7/k"}, "o1", "", 0); err != nil || lk.Label != "" {
		t.Fatalf("unlabelled acquire: %+v %v", lk, err)
	}
}
