package verify

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RunWorkerProcess is the body of `ticketlab verify worker`: the worker
// loop in its own process, writing to the protected resource over the
// store's unix socket and reporting every operation as a JSON line on out.
// It returns when ctx ends (SIGTERM), after releasing what it holds and
// closing its session.
func RunWorkerProcess(ctx context.Context, p WorkerParams, storeSocket string, out io.Writer) error {
	sc := &storeClient{path: storeSocket}
	enc := json.NewEncoder(out)
	var encErr error
	// An extender's session reader reports `! LOST` and `! POSITION`
	// events beside the worker's own operations: one line at a time.
	var mu sync.Mutex
	runWorker(ctx, p, sc.write, func(op Op) {
		mu.Lock()
		defer mu.Unlock()
		if err := enc.Encode(op); err != nil && encErr == nil {
			encErr = err
		}
	})
	mu.Lock()
	defer mu.Unlock()
	return encErr
}

// workerArgs is the command line of a worker process.
func workerArgs(p WorkerParams, storeSocket string) []string {
	return []string{"verify", "worker",
		"--id", strconv.Itoa(p.ID),
		"--seed", strconv.FormatInt(p.Seed, 10),
		"--socket", p.Socket,
		"--store", storeSocket,
		"--keys", strings.Join(p.Keys, ","),
		"--hold-min", p.HoldMin.String(),
		"--hold-max", p.HoldMax.String(),
		"--late", strconv.FormatFloat(p.LateProb, 'f', -1, 64),
		"--block-share", strconv.FormatFloat(p.BlockShare, 'f', -1, 64),
		"--extend=" + strconv.FormatBool(p.Extend),
		"--stall", strconv.FormatFloat(p.StallProb, 'f', -1, 64),
	}
}

// workerProc is a running worker process as the harness sees it.
type workerProc struct {
	id   int
	cmd  *exec.Cmd
	done chan struct{}

	mu      sync.Mutex
	holding map[int64]Op // granted acquires not yet released
	paused  bool
}

// startWorkerProc starts a worker process and feeds its reports into h.
func startWorkerProc(binary string, p WorkerParams, storeSocket string, h *History, stderr io.Writer) (*workerProc, error) {
	cmd := exec.Command(binary, workerArgs(p, storeSocket)...)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &workerProc{id: p.ID, cmd: cmd, done: make(chan struct{}), holding: map[int64]Op{}}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var op Op
			if err := json.Unmarshal(sc.Bytes(), &op); err != nil {
				fmt.Fprintf(stderr, "worker %d: bad report %q: %v\n", p.ID, sc.Text(), err)
				continue
			}
			op.Sidecar = p.Sidecar
			w.mu.Lock()
			switch {
			case op.Kind == KindAcquire && op.Result == ResOK:
				w.holding[op.ID] = op
			case op.Kind == KindRelease:
				delete(w.holding, op.Acq)
			case op.Kind == KindClose:
				clear(w.holding)
			}
			w.mu.Unlock()
			h.Add(op)
		}
		cmd.Wait()
	}()
	return w, nil
}

// holds returns a lock the worker holds now, if any; with block set, only
// a block.
func (w *workerProc) holds(block bool) (Op, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, op := range w.holding {
		if !block || isBlock(op) {
			return op, true
		}
	}
	return Op{}, false
}

func (w *workerProc) signal(sig syscall.Signal) {
	w.mu.Lock()
	switch sig {
	case syscall.SIGSTOP:
		w.paused = true
	case syscall.SIGCONT:
		w.paused = false
	}
	w.mu.Unlock()
	_ = w.cmd.Process.Signal(sig)
}

// stop resumes the worker if paused, asks it to finish and waits.
func (w *workerProc) stop(timeout time.Duration) {
	w.signal(syscall.SIGCONT)
	w.signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(timeout):
		w.cmd.Process.Kill()
		<-w.done
	}
}
