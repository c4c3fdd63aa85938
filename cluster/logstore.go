package cluster

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"
)

// LogStoreKind names the Raft log store of a node: where its log entries
// and its stable state (current term, the vote it gave) live in its data
// dir. Both kinds make every append durable before it returns (a follower
// acknowledges, and a leader counts itself, only after that), so they give
// the same guarantees; they differ in what an append costs and in their
// files. The kind is fixed per data dir: OpenLogStore refuses a data dir
// that the other kind wrote. LogStoreAuto, the default, names no kind: it
// opens whatever the data dir holds and creates FreshLogStore (wal) in a
// data dir that holds none. It is a flag.Value (`--log-store`).
type LogStoreKind string

const (
	// LogStoreAuto, the default (and what the zero LogStoreKind means in a
	// Config and to OpenLogStore), keeps the store a data dir holds and
	// creates FreshLogStore in one that holds none: a fresh node runs on
	// wal, a data dir written by bolt (raft.db, as every build before wal
	// became the default wrote) stays on bolt, and the node logs one
	// warning saying so and how to move it (docs/operations.md, "Moving a
	// node to the other log store": replace it with a fresh data dir).
	LogStoreAuto LogStoreKind = "auto"
	// LogStoreBolt is raft-boltdb/v2 over bbolt, the design's first
	// store and the default before wal: one
	// file, DATA-DIR/raft.db, a B+tree holding the log and the stable
	// store. Every append is one bolt transaction: two fdatasyncs (the
	// data pages, then the meta page). Pages freed by log truncation after
	// a snapshot stay in the file, on bolt's free list.
	LogStoreBolt LogStoreKind = "bolt"
	// LogStoreWAL is hashicorp/raft-wal (v0.4.1): DATA-DIR/wal/, holding
	// append-only segment files of 64 MiB each (preallocated, so a node's
	// log takes at least 64 MiB of disk) and wal-meta.db, a small bolt
	// file for the stable store and the list of segments. Every append is
	// one write and one fsync of the tail segment (the meta file is
	// written only when a segment fills up or the log is truncated); a
	// torn last batch is cut off at the previous commit frame on open.
	// Truncation deletes whole segments: no free list (a truncation of the
	// log's tail starts a new segment). raft-wal calls itself
	// experimental. It is what LogStoreAuto creates in a new data dir.
	LogStoreWAL LogStoreKind = "wal"
)

// DefaultLogStore is Config.LogStore's default: LogStoreAuto.
const DefaultLogStore = LogStoreAuto

// FreshLogStore is the kind LogStoreAuto creates in a data dir that holds
// no log store.
const FreshLogStore = LogStoreWAL

// The files each kind keeps in a data dir, by which DetectLogStore knows
// what a data dir holds.
const (
	boltFile = "raft.db"
	walDir   = "wal"
)

// walLockFile, in the wal dir, is locked (flock) by the process that has
// the store open: raft-wal opens its meta file without bolt's lock
// timeout, so a second node on the same data dir would wait forever.
const walLockFile = "lock"

// storeLockTimeout is how long opening a store waits for another process
// to let go of it.
const storeLockTimeout = 2 * time.Second

// String implements flag.Value.
func (k LogStoreKind) String() string { return string(k) }

// Set implements flag.Value: "auto", "bolt" or "wal".
func (k *LogStoreKind) Set(s string) error {
	v := LogStoreKind(s)
	if err := v.check(); err != nil {
		return err
	}
	*k = v
	return nil
}

// check reports whether k is a known kind.
func (k LogStoreKind) check() error {
	switch k {
	case LogStoreAuto, LogStoreBolt, LogStoreWAL:
		return nil
	}
	return fmt.Errorf("log store %q: want auto, bolt or wal", string(k))
}

// LogStore is a node's open Raft log and stable store (OpenLogStore).
type LogStore interface {
	raft.LogStore
	raft.StableStore
	io.Closer
}

// DetectLogStore reports which kind of log store dataDir holds: "" when it
// holds none (a new data dir). A data dir holding both is an error
// (ErrLogStoreMismatch): nothing tells which one is this node's log.
func DetectLogStore(dataDir string) (LogStoreKind, error) {
	var found []LogStoreKind
	for _, c := range []struct {
		kind LogStoreKind
		name string
	}{{LogStoreBolt, boltFile}, {LogStoreWAL, walDir}} {
		_, err := os.Lstat(filepath.Join(dataDir, c.name))
		switch {
		case err == nil:
			found = append(found, c.kind)
		case !errors.Is(err, os.ErrNotExist):
			return "", fmt.Errorf("%w: %w", ErrLogStoreMismatch, err)
		}
	}
	switch len(found) {
	case 0:
		return "", nil
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%w: %s holds both a bolt log store (%s) and a wal log store (%s/); refusing to guess "+
		"which one is this node's log", ErrLogStoreMismatch, dataDir, boltFile, walDir)
}

// ResolveLogStore is the kind of log store OpenLogStore(dataDir, kind)
// opens: kind itself when it names one (bolt or wal), and for LogStoreAuto
// (or "") the kind dataDir holds, or FreshLogStore when it holds none. It
// reports the errors of DetectLogStore and of an unknown kind, not a
// mismatch between an explicit kind and dataDir's (OpenLogStore does).
func ResolveLogStore(dataDir string, kind LogStoreKind) (LogStoreKind, error) {
	if kind == "" {
		kind = DefaultLogStore
	}
	if err := kind.check(); err != nil {
		return "", fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	if kind != LogStoreAuto {
		return kind, nil
	}
	found, err := DetectLogStore(dataDir)
	if err != nil || found != "" {
		return found, err
	}
	return FreshLogStore, nil
}

// OpenLogStore opens (creating if need be) the Raft log and stable store
// of a node's data directory, of the given kind ("" is DefaultLogStore,
// LogStoreAuto: what dataDir holds, wal in a new one; ResolveLogStore),
// with the options a node uses. Nodes and bootstrap use it; so does the
// lab's `bench disk`, which measures what one durable append costs on a
// disk, and so can tools that read a stopped node's log.
//
// It refuses (ErrLogStoreMismatch) a data dir that holds the other kind:
// opened with the wrong kind, a node would start with an empty log and no
// memory of its term and vote, under its old server id, and could vote a
// candidate that lacks committed entries into office. For the same
// reason it refuses (ErrLogStoreMissing) a data dir that has a server
// identity but no log store at all: that log was lost.
func OpenLogStore(dataDir string, kind LogStoreKind) (LogStore, error) {
	s, _, err := openLogStore(dataDir, kind, slog.Default())
	return s, err
}

// openLogStore is OpenLogStore, logging to log, and it returns the kind
// it opened (auto resolved). Under LogStoreAuto a data dir that holds bolt
// is opened as bolt, with one warning: bolt is not the default any more,
// and the way to wal is a fresh data dir.
func openLogStore(dataDir string, kind LogStoreKind, log *slog.Logger) (LogStore, LogStoreKind, error) {
	if kind == "" {
		kind = DefaultLogStore
	}
	if err := kind.check(); err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	found, err := DetectLogStore(dataDir)
	if err != nil {
		return nil, "", err
	}
	if kind == LogStoreAuto {
		kind = FreshLogStore
		if found != "" {
			kind = found
		}
		if found == LogStoreBolt {
			log.Warn("this data dir holds a bolt log store (raft.db), so the node stays on bolt; new data dirs get wal. "+
				"To move the node to wal, replace it with a fresh data dir (docs/operations.md, \"Moving a node to the other "+
				"log store\"); --log-store bolt keeps bolt without this line",
				"data_dir", dataDir, "log_store", string(kind))
		}
	}
	switch {
	case found != "" && found != kind:
		return nil, "", fmt.Errorf("%w: %s holds a %s log store (%s), and this node was started with --log-store %s; "+
			"start it with --log-store %s (the log store is fixed per data dir)",
			ErrLogStoreMismatch, dataDir, found, storePath(found), kind, found)
	case found == "":
		if _, err := os.Stat(filepath.Join(dataDir, identityFile)); err == nil {
			return nil, "", fmt.Errorf("%w: %s has a server identity (%s) but neither a bolt (%s) nor a wal (%s/) "+
				"log store: its log, term and vote were lost, and it must not vote under its old identity; "+
				"wipe the whole data dir and add the node again as a new server (ticketing members replace)",
				ErrLogStoreMissing, dataDir, identityFile, boltFile, walDir)
		}
	}
	if kind == LogStoreWAL {
		s, err := openWAL(filepath.Join(dataDir, walDir), newHCLogger(log))
		if err != nil {
			return nil, kind, err
		}
		return s, kind, nil
	}
	s, err := raftboltdb.New(raftboltdb.Options{
		Path:        filepath.Join(dataDir, boltFile),
		BoltOptions: boltOptions(),
	})
	if err != nil {
		return nil, kind, err
	}
	return s, kind, nil
}

// storePath is the file or directory a kind keeps in a data dir, as
// messages name it.
func storePath(k LogStoreKind) string {
	if k == LogStoreWAL {
		return walDir + "/"
	}
	return boltFile
}

// boltOptions are the options of the Raft log store (raft-boltdb/v2 over
// bbolt). Every commit syncs: durability is not tunable. (NoFreelistSync
// with the hash-map free list, as etcd uses, made no measurable difference
// to append latency here: 1.4–1.8 ms per StoreLogs either way at 64
// clients, so the defaults stay.)
func boltOptions() *bbolt.Options {
	return &bbolt.Options{Timeout: storeLockTimeout}
}

// walStore is raft-wal's WAL with this package's lock of the directory,
// and its meta store, which the WAL's Close closes as well (v0.4.0 did not,
// and a node restarted in the same process then waited forever on its bolt
// lock; a second close is a no-op).
type walStore struct {
	*wal.WAL
	meta *metadb.BoltMetaDB
	lock *os.File
}

// The WAL is monotonic: hashicorp/raft then removes the whole log after
// installing a snapshot instead of leaving a gap, which raft-wal refuses.
var _ raft.MonotonicLogStore = (*walStore)(nil)

// openWAL opens (creating) the raft-wal store in dir.
func openWAL(dir string, log hclog.Logger) (*walStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: wal dir: %w", err)
	}
	lock, err := lockFile(filepath.Join(dir, walLockFile), storeLockTimeout)
	if err != nil {
		return nil, err
	}
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(dir, wal.WithMetaStore(meta), wal.WithLogger(log.Named("wal")))
	if err != nil {
		_ = meta.Close() // the open's error is the one to report
		lock.Close()
		return nil, fmt.Errorf("cluster: open wal %s: %w", dir, err)
	}
	return &walStore{WAL: w, meta: meta, lock: lock}, nil
}

// Close closes the WAL, its meta store and the lock.
func (s *walStore) Close() error {
	err := s.WAL.Close()
	if merr := s.meta.Close(); err == nil {
		err = merr
	}
	s.lock.Close()
	return err
}

// lockFile opens path (creating it) and takes an exclusive flock on it,
// trying for up to timeout; the lock lasts until the file is closed.
func lockFile(path string, timeout time.Duration) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("cluster: lock %s: %w", path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
