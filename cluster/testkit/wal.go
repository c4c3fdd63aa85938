package testkit

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The on-disk format of a raft-wal segment file (hashicorp/raft-wal
// v0.4.1, its README, "Segment Files"): a 32-byte file header, then
// frames, each an 8-byte header (type, 3 reserved bytes, a little-endian
// uint32 that is the payload length, or for a commit frame the CRC of the
// batch) and its payload padded with zeros to 8 bytes. An append writes
// its entry frames and then one commit frame, then fsyncs; on open the
// tail segment is read up to its last intact commit frame. The file is
// preallocated, so after the written frames come zeros.
const (
	walFileHeader  = 32
	walFrameHeader = 8
	walFrameEntry  = 1
	walFrameIndex  = 2
	walFrameCommit = 3
)

// WALTail is the tail segment file of a raft-wal log store in a stopped
// node's data dir (DATA-DIR/wal/), as the crash tests read and damage it.
type WALTail struct {
	// Path is the segment file.
	Path string
	// Commits are the offsets of its commit frames, in file order; Entries
	// the number of entry frames before each of them.
	Commits, Entries []int64
}

// ReadWALTail finds the tail segment (the one with the highest base index)
// in dataDir/wal and walks its frames. It fails t if there is none, or if
// it holds no commit frame.
func ReadWALTail(t testing.TB, dataDir string) WALTail {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dataDir, "wal", "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no wal segment in %s: %v", dataDir, err)
	}
	slices.Sort(segs) // named BASEINDEX-ID.wal, both fixed width: sorted by base index
	w := WALTail{Path: segs[len(segs)-1]}
	b, err := os.ReadFile(w.Path)
	if err != nil {
		t.Fatal(err)
	}
	var entries int64
walk:
	for off := int64(walFileHeader); off+walFrameHeader <= int64(len(b)); {
		typ, n := b[off], binary.LittleEndian.Uint32(b[off+4:off+8])
		switch typ {
		case walFrameEntry:
			entries++
			off += walFrameHeader + (int64(n)+7)&^7
		case walFrameIndex:
			off += walFrameHeader + (int64(n)+7)&^7
		case walFrameCommit:
			w.Commits = append(w.Commits, off)
			w.Entries = append(w.Entries, entries)
			off += walFrameHeader
		default:
			break walk // zeros (never written), or a torn frame
		}
	}
	if len(w.Commits) == 0 {
		t.Fatalf("%s: no commit frame", w.Path)
	}
	return w
}

// LastBatch is the number of entries in the last committed batch.
func (w WALTail) LastBatch() int64 {
	n := len(w.Entries)
	if n == 1 {
		return w.Entries[0]
	}
	return w.Entries[n-1] - w.Entries[n-2]
}

// TearNextAppend writes, right after the last commit frame, what a crash
// in the middle of the next append leaves: an entry frame whose header
// and first half were written and whose rest and commit frame were not.
// That append's fsync had not returned, so nothing of it was
// acknowledged.
func (w WALTail) TearNextAppend(t testing.TB) {
	t.Helper()
	at := w.Commits[len(w.Commits)-1] + walFrameHeader
	frame := make([]byte, walFrameHeader+60)
	frame[0] = walFrameEntry
	binary.LittleEndian.PutUint32(frame[4:], 120)
	for i := walFrameHeader; i < len(frame); i++ {
		frame[i] = byte(i*7 + 3)
	}
	writeAt(t, w.Path, frame, at)
}

// CutLastBatch truncates the file in the middle of the last committed
// batch, its commit frame gone: damage to data that was fsynced and
// acknowledged, which no crash of the process or the machine can do (a
// disk that loses or garbles acknowledged writes can). It needs a commit
// before that batch.
func (w WALTail) CutLastBatch(t testing.TB) {
	t.Helper()
	if len(w.Commits) < 2 {
		t.Fatalf("%s: one commit frame, want an earlier one to fall back to", w.Path)
	}
	start, end := w.Commits[len(w.Commits)-2]+walFrameHeader, w.Commits[len(w.Commits)-1]
	if err := os.Truncate(w.Path, start+(end-start)/2); err != nil {
		t.Fatal(err)
	}
}

// GarbleLastBatch flips bytes in the middle of the last committed batch,
// whose commit frame's CRC then fails: the same damage as CutLastBatch
// with the file's length kept.
func (w WALTail) GarbleLastBatch(t testing.TB) {
	t.Helper()
	if len(w.Commits) < 2 {
		t.Fatalf("%s: one commit frame, want an earlier one to fall back to", w.Path)
	}
	start, end := w.Commits[len(w.Commits)-2]+walFrameHeader, w.Commits[len(w.Commits)-1]
	at := start + walFrameHeader + (end-start-walFrameHeader)/2 // inside the batch, past its first frame header
	b := make([]byte, 1)
	f, err := os.Open(w.Path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.ReadAt(b, at)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, w.Path, []byte{^b[0]}, at)
}

func writeAt(t testing.TB, path string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
