// Package faults is the lab's fault file: one JSON format for every lab
// process, one strict poller, and what plugs it into the seams of a node
// (cluster.Config.PeerNet and Now) and of a sidecar
// (sidecar.Config.Dialer). `ticketlab node --fault-file F` and `ticketlab
// sidecar --fault-file F` are the product's commands with these plugged
// in; the product binary has no fault file.
package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// Spec is the content of a fault file, JSON:
//
//	{"cut": [["n1","n2"]], "freeze": [["n1","n3"]], "clock_offset_ms": -30000, "drop_connections": 3, "cut_addrs": ["127.0.0.1:7001"]}
//
// A node applies Cut, Freeze and ClockOffsetMs; a sidecar applies
// DropConnections and CutAddrs. Cut and Freeze name links by node id (see
// netfault.Network for what each does; both directions are affected, but
// each node applies its own file to its own connections, so a test writes
// the same links into every node's file). ClockOffsetMs is added to the
// wall clock the node stamps into proposed commands (cluster.Config.Now).
// DropConnections is a counter: each time it grows, the sidecar drops
// every cluster connection it has. A missing or empty file is the zero
// Spec: no faults.
type Spec struct {
	Cut             [][2]string `json:"cut,omitempty"`
	Freeze          [][2]string `json:"freeze,omitempty"`
	ClockOffsetMs   int64       `json:"clock_offset_ms,omitempty"`
	DropConnections uint64      `json:"drop_connections,omitempty"`
	// CutAddrs (a sidecar) are cluster addresses the sidecar cannot
	// reach: its connections to them are closed at once and its dials of
	// them fail until they leave the list (the partition-sidecar fault:
	// a sidecar cut off together with the old leader).
	CutAddrs []string `json:"cut_addrs,omitempty"`
}

// PollInterval is how often a lab process rereads its fault file.
const PollInterval = 20 * time.Millisecond

// ErrBadFile wraps a fault file that does not parse (unknown fields
// included: a misspelt fault must not pass for no fault).
var ErrBadFile = errors.New("faults: bad fault file")

// Read reads a fault file; a missing file is the zero Spec.
func Read(path string) (Spec, error) {
	b, err := read(path)
	if err != nil {
		return Spec{}, err
	}
	return parse(b)
}

func read(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

func parse(b []byte) (Spec, error) {
	var s Spec
	if len(bytes.TrimSpace(b)) == 0 {
		return s, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Spec{}, fmt.Errorf("%w: %w", ErrBadFile, err)
	}
	if dec.More() {
		return Spec{}, fmt.Errorf("%w: more than one JSON value", ErrBadFile)
	}
	return s, nil
}

// Write replaces path with spec atomically (a temporary file renamed into
// place), so a polling process never reads half a file.
func Write(path string, spec Spec) error {
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".faults-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Watch is the one poller. It reads the fault file at path and applies it
// at once, returning an error when the file cannot be read or does not
// parse (the process refuses to start: a process restarted in the middle
// of a partition must come up partitioned, not healthy). Then, until ctx
// ends, it rereads the file every interval and applies each change; a file
// that becomes unreadable or bad keeps the faults in force and is logged
// when it turns so and whenever its bad content changes. apply is never
// called concurrently.
func Watch(ctx context.Context, path string, interval time.Duration, log *slog.Logger, apply func(Spec)) error {
	last, err := read(path)
	if err != nil {
		return err
	}
	spec, err := parse(last)
	if err != nil {
		return err
	}
	apply(spec)
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		failing := false
		var bad []byte // the content that failed to parse, if that was it
		for {
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
			b, err := read(path)
			if err == nil && bytes.Equal(b, last) {
				failing = false
				continue
			}
			var spec Spec
			if err == nil {
				spec, err = parse(b)
			}
			if err != nil {
				if !failing || b != nil && !bytes.Equal(b, bad) {
					log.Error("fault file unreadable; keeping the faults in force", "path", path, "err", err)
				}
				failing, bad = true, b
				continue
			}
			failing, last = false, b
			apply(spec)
		}
	}()
	return nil
}
