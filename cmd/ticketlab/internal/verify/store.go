package verify

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Store is the protected resource: a per-key register that accepts a write
// only if its fencing token is above the key's high-water mark, checked and
// updated atomically with the write (like a database's conditional write).
// A block's write (WriteBlock) covers every key of the block under its one
// token, in one step: accepted on every key if the token is above every
// key's high-water mark, else on none (like a transaction that checks the
// fence of each seat it books). Workers in the harness call Write and
// WriteBlock; worker processes reach it over a unix socket (Serve). Every
// attempt is logged with its outcome and time, one record per key.
type Store struct {
	mu  sync.Mutex
	hw  map[string]uint64
	log []StoreRec

	ln   net.Listener
	wg   sync.WaitGroup
	done chan struct{}
}

// StoreRec is one key of one write attempt, in the order the store decided
// them (a block's records are consecutive, in the order of its keys).
type StoreRec struct {
	Seq      int
	Key      string
	Token    uint64
	Worker   int
	Op       int64 // the write's op id
	At       int64 // Unix ns when decided
	Accepted bool
	HW       uint64 // the key's high-water mark before this write
	// Keys are every key of a block's write (nil for one key): the write
	// has one record per key, all accepted or none.
	Keys []string
}

// NewStore returns an empty store.
func NewStore() *Store { return &Store{hw: map[string]uint64{}, done: make(chan struct{})} }

// Write applies the fencing check and the write atomically. It reports
// whether the write was accepted and the high-water mark it was checked
// against.
func (s *Store) Write(key string, token uint64, worker int, op int64) (bool, uint64) {
	return s.WriteBlock([]string{key}, token, worker, op)
}

// WriteBlock writes every key of keys under token in one step, fenced on
// each: accepted on all of them if token is above each one's high-water
// mark, else on none. It reports whether the write was accepted and,
// when not, the high-water mark of the first key that refused it.
func (s *Store) WriteBlock(keys []string, token uint64, worker int, op int64) (bool, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok, refused := true, uint64(0)
	for _, k := range keys {
		if hw := s.hw[k]; token <= hw {
			if ok {
				refused = hw
			}
			ok = false
		}
	}
	var block []string
	if len(keys) > 1 {
		block = append([]string(nil), keys...)
	}
	at := time.Now().UnixNano()
	for _, k := range keys {
		s.log = append(s.log, StoreRec{Seq: len(s.log), Key: k, Token: token, Worker: worker, Op: op,
			At: at, Accepted: ok, HW: s.hw[k], Keys: block})
		if ok {
			s.hw[k] = token
		}
	}
	return ok, refused
}

// Log returns every write attempt in decision order.
func (s *Store) Log() []StoreRec {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]StoreRec(nil), s.log...)
}

// Serve listens on a unix socket at path. The protocol is one line per
// write, "W <key> <token> <worker> <op>" (one key) or "B <token> <worker>
// <op> <key1> <key2> ..." (a block, 2 or more keys), answered "OK" or
// "REJECT <hw>".
func (s *Store) Serve(path string) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	s.ln = ln
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go s.serveConn(c)
		}
	}()
	return nil
}

func (s *Store) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	go func() { <-s.done; c.Close() }()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		var keys []string
		var nums []string
		switch {
		case len(f) == 5 && f[0] == "W":
			keys, nums = f[1:2], f[2:5]
		case len(f) >= 6 && f[0] == "B":
			keys, nums = f[4:], f[1:4]
		default:
			if _, err := fmt.Fprintf(c, "ERR bad request\n"); err != nil {
				return // the worker's connection is gone; it retries on a new one
			}
			continue
		}
		tok, err1 := strconv.ParseUint(nums[0], 10, 64)
		w, err2 := strconv.Atoi(nums[1])
		op, err3 := strconv.ParseInt(nums[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			if _, err := fmt.Fprintf(c, "ERR bad numbers\n"); err != nil {
				return // the worker's connection is gone; it retries on a new one
			}
			continue
		}
		if ok, hw := s.WriteBlock(keys, tok, w, op); ok {
			if _, err := fmt.Fprintf(c, "OK\n"); err != nil {
				return // the worker's connection is gone; it retries on a new one
			}
		} else {
			if _, err := fmt.Fprintf(c, "REJECT %d\n", hw); err != nil {
				return // the worker's connection is gone; it retries on a new one
			}
		}
	}
}

// Close stops serving.
func (s *Store) Close() {
	select {
	case <-s.done:
		return
	default:
	}
	close(s.done)
	if s.ln != nil {
		s.ln.Close()
	}
	s.wg.Wait()
}

// ErrStore is returned by a remote write that got no clear answer.
var ErrStore = errors.New("verify: protected resource unreachable")

// storeClient is a worker process's connection to the store.
type storeClient struct {
	path string
	c    net.Conn
	r    *bufio.Reader
}

func (sc *storeClient) write(keys []string, token uint64, worker int, op int64) (bool, error) {
	if sc.c == nil {
		c, err := net.Dial("unix", sc.path)
		if err != nil {
			return false, fmt.Errorf("%w: %w", ErrStore, err)
		}
		sc.c, sc.r = c, bufio.NewReader(c)
	}
	req := fmt.Sprintf("W %s %d %d %d\n", keys[0], token, worker, op)
	if len(keys) > 1 {
		req = fmt.Sprintf("B %d %d %d %s\n", token, worker, op, strings.Join(keys, " "))
	}
	if _, err := io.WriteString(sc.c, req); err != nil {
		sc.c.Close()
		sc.c = nil
		return false, fmt.Errorf("%w: %w", ErrStore, err)
	}
	line, err := sc.r.ReadString('\n')
	if err != nil {
		sc.c.Close()
		sc.c = nil
		return false, fmt.Errorf("%w: %w", ErrStore, err)
	}
	switch {
	case line == "OK\n":
		return true, nil
	case strings.HasPrefix(line, "REJECT "):
		return false, nil
	}
	return false, fmt.Errorf("%w: answer %q", ErrStore, line)
}
