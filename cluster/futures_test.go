package cluster

import (
	"errors"
	"testing"
	"time"
)

// neverAnswered is a Raft future that is never answered, as one left in
// Raft's apply buffer when Raft shuts down (Config.BatchApplyCh). waiting
// receives a value each time someone starts waiting on it.
type neverAnswered struct{ waiting chan struct{} }

func (f neverAnswered) Error() error {
	f.waiting <- struct{}{}
	select {}
}
func (neverAnswered) Response() interface{} { return nil }
func (neverAnswered) Index() uint64         { return 0 }

// A batch future Raft never answers must not keep Close waiting: a CI run
// hung 19 minutes in Node.Close (TestFiveNodesToleratesTwoDown) on such a
// future, awaited by a goroutine of the node's wait group.
func TestCloseDoesNotWaitForAnUnansweredFuture(t *testing.T) {
	n := &Node{closing: make(chan struct{}), futures: make(chan batchFuture, 1), slots: make(chan struct{}, 1)}
	f := neverAnswered{waiting: make(chan struct{}, 2)}
	n.slots <- struct{}{}
	n.futures <- batchFuture{f: f}
	n.wg.Add(1)
	go n.futureLoop()
	awaited := make(chan error, 1)
	go func() { awaited <- n.await(f) }()
	<-f.waiting // both wait on the future now
	<-f.waiting
	close(n.closing)
	stopped := make(chan struct{})
	go func() { n.wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("futureLoop still waits for a future Raft never answers after the node closed")
	}
	select {
	case err := <-awaited:
		if !errors.Is(err, ErrClosing) {
			t.Fatalf("await returned %v, want ErrClosing", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("await still waits for a future Raft never answers after the node closed")
	}
}
