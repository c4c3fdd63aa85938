package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"ticketing/cluster/netfault"
)

// FaultSpec is the content of a fault file (Config.FaultFile), JSON:
//
//	{"cut": [["n1","n2"]], "freeze": [["n1","n3"]], "clock_offset_ms": -30000}
//
// Cut and Freeze name links by node id (see Faults for what each does; both
// directions are affected, but each node applies its own file to its own
// connections, so a test writes the same links into every node's file).
// ClockOffsetMs is added to the wall clock the node stamps into proposed
// commands (Config.Now). A missing file means no faults.
type FaultSpec struct {
	Cut           [][2]string `json:"cut,omitempty"`
	Freeze        [][2]string `json:"freeze,omitempty"`
	ClockOffsetMs int64       `json:"clock_offset_ms,omitempty"`
}

// FaultPollInterval is how often a node rereads its fault file.
const FaultPollInterval = 20 * time.Millisecond

// ErrBadFaultFile wraps a fault file that does not parse.
var ErrBadFaultFile = errors.New("cluster: bad fault file")

// ReadFaultFile reads a fault file; a missing file is the empty spec.
func ReadFaultFile(path string) (FaultSpec, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return FaultSpec{}, nil
	}
	if err != nil {
		return FaultSpec{}, err
	}
	return parseFaultSpec(b)
}

func parseFaultSpec(b []byte) (FaultSpec, error) {
	var s FaultSpec
	if len(bytes.TrimSpace(b)) == 0 {
		return s, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return FaultSpec{}, fmt.Errorf("%w: %w", ErrBadFaultFile, err)
	}
	return s, nil
}

// WriteFaultFile replaces path with spec atomically (a temporary file
// renamed into place), so a polling node never reads half a file.
func WriteFaultFile(path string, spec FaultSpec) error {
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

// faultFile drives a node's Faults and clock offset from Config.FaultFile.
type faultFile struct {
	path   string
	faults *netfault.Network
	offset atomic.Int64 // ms added to the stamped wall clock
	last   []byte
}

// setupFaultFile installs fault injection into cfg when cfg.FaultFile is
// set: a Faults for the peer transport (unless the caller gave one) and a
// clock offset in front of cfg.Now. The file is read once here, so a node
// restarted in the middle of a partition comes up partitioned.
func setupFaultFile(cfg *Config) (*faultFile, error) {
	if cfg.FaultFile == "" {
		return nil, nil
	}
	ff := &faultFile{path: cfg.FaultFile, faults: netfault.New()}
	cfg.PeerNet = ff.faults
	base := cfg.Now
	cfg.Now = func() time.Time { return base().Add(time.Duration(ff.offset.Load()) * time.Millisecond) }
	if _, err := ff.poll(); err != nil {
		return nil, err
	}
	return ff, nil
}

// poll applies the file if it changed; it reports the spec it applied.
func (ff *faultFile) poll() (*FaultSpec, error) {
	b, err := os.ReadFile(ff.path)
	if errors.Is(err, fs.ErrNotExist) {
		b, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	if ff.last != nil && bytes.Equal(b, ff.last) {
		return nil, nil
	}
	spec, err := parseFaultSpec(b)
	if err != nil {
		return nil, err
	}
	ff.last = append([]byte{}, b...)
	ff.faults.SetLinks(spec.Cut, spec.Freeze)
	ff.offset.Store(spec.ClockOffsetMs)
	return &spec, nil
}

// pollFaultFile rereads the fault file every FaultPollInterval until the
// node closes.
func (n *Node) pollFaultFile() {
	defer n.wg.Done()
	t := time.NewTicker(FaultPollInterval)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-t.C:
		case <-n.closing:
			return
		}
		spec, err := n.faultFile.poll()
		switch {
		case err != nil:
			if err.Error() != lastErr {
				n.log.Error("fault file unreadable; keeping the previous faults", "path", n.faultFile.path, "err", err)
			}
			lastErr = err.Error()
		case spec != nil:
			lastErr = ""
			n.log.Warn("FAULT INJECTION: applying fault file", "cut", spec.Cut, "freeze", spec.Freeze,
				"clock_offset_ms", spec.ClockOffsetMs)
		}
	}
}
