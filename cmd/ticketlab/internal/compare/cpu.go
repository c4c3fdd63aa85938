package compare

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Process is one server process whose CPU time a run records.
type Process struct {
	// Name names it within its system: n1..n3 and sidecar1 (Ticketing),
	// etcd-1..3, zk-1..3, redis (peers.sh's names).
	Name string
	// Role is leader, follower or sidecar when known at the run's start.
	Role string
	// Pid is its process id.
	Pid int
}

// ProcCPU is one server process's CPU time over a run's measured window.
type ProcCPU struct {
	// Name and Role: see Process.
	Name string `json:"name"`
	Role string `json:"role,omitempty"`
	// Pid is the process id.
	Pid int `json:"pid"`
	// CPUms is its user+system time over the window, all threads, in ms.
	CPUms float64 `json:"cpu_ms"`
	// USPerCycle is CPUms per cycle of the window (per grant when
	// contended), in µs.
	USPerCycle float64 `json:"us_per_cycle"`
}

// selfPid stands for this process (the harness) in procCPU.
const selfPid = 0

// clockTicks is the unit of utime and stime in /proc/PID/stat (CLK_TCK):
// the kernel's AT_CLKTCK from this process's auxiliary vector, which is
// what sysconf(_SC_CLK_TCK) returns, or else 100.
var clockTicks = sync.OnceValue(func() int64 {
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return 100
	}
	const atClkTck = 17
	word := int(unsafe.Sizeof(uintptr(0)))
	for i := 0; i+2*word <= len(b); i += 2 * word {
		var k, v uint64
		if word == 8 {
			k, v = binary.NativeEndian.Uint64(b[i:]), binary.NativeEndian.Uint64(b[i+word:])
		} else {
			k, v = uint64(binary.NativeEndian.Uint32(b[i:])), uint64(binary.NativeEndian.Uint32(b[i+word:]))
		}
		if k == atClkTck && v > 0 {
			return int64(v)
		}
		if k == 0 {
			break
		}
	}
	return 100
})

// procCPU is a process's CPU time so far, user + system over all its
// threads (those ended included), from /proc/PID/stat; selfPid reads
// /proc/self/stat.
func procCPU(pid int) (time.Duration, error) {
	p := "/proc/self/stat"
	if pid != selfPid {
		p = fmt.Sprintf("/proc/%d/stat", pid)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, fmt.Errorf("cpu: %w", err)
	}
	// Fields after the ")" that ends the command name: state is the 1st,
	// utime the 12th and stime the 13th, in clock ticks.
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, fmt.Errorf("cpu: %s: no command name", p)
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("cpu: %s: %d fields", p, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("cpu: %s: utime %q stime %q", p, f[11], f[12])
	}
	return time.Duration(ut+st) * time.Second / time.Duration(clockTicks()), nil
}

// cpuSample is the CPU time so far of each of a run's server processes
// and of this process.
type cpuSample struct {
	procs []time.Duration
	self  time.Duration
}

// sampleCPU reads the CPU time of procs and of this process.
func sampleCPU(procs []Process) (cpuSample, error) {
	var s cpuSample
	for _, p := range procs {
		d, err := procCPU(p.Pid)
		if err != nil {
			return s, fmt.Errorf("%s (pid %d): %w", p.Name, p.Pid, err)
		}
		s.procs = append(s.procs, d)
	}
	var err error
	s.self, err = procCPU(selfPid)
	return s, err
}

// setCPU fills res's CPU figures from the samples taken at the window's
// start and end, over ops cycles (grants when contended).
func setCPU(res *Result, procs []Process, s0, s1 cpuSample, ops int) {
	if ops <= 0 {
		res.CPUNote = "no cycle in the window"
		return
	}
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(ops) }
	var total time.Duration
	for i, p := range procs {
		d := s1.procs[i] - s0.procs[i]
		total += d
		res.Procs = append(res.Procs, ProcCPU{Name: p.Name, Role: p.Role, Pid: p.Pid, CPUms: ms(d), USPerCycle: per(d)})
	}
	res.ServerCPUms = ms(total)
	res.ServerCPUus = per(total)
	res.HarnessCPUms = ms(s1.self - s0.self)
	res.HarnessCPUus = per(s1.self - s0.self)
}

// peerProcesses reads the pids that `peers.sh start DIR` recorded in
// DIR/pids/NAME.pid for names, and checks that each names a running
// process whose command is comm (a pid file outliving its process, its pid
// reused, must not be measured).
func peerProcesses(dir string, names []string, comm string) ([]Process, error) {
	var out []Process
	for _, name := range names {
		pf := filepath.Join(dir, "pids", name+".pid")
		b, err := os.ReadFile(pf)
		if err != nil {
			return nil, fmt.Errorf("pid of %s: %w (started by peers.sh start %s?)", name, err, dir)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("pid of %s: %s: %q is not a pid", name, pf, strings.TrimSpace(string(b)))
		}
		c, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			return nil, fmt.Errorf("%s: pid %d from %s is not running", name, pid, pf)
		}
		if got := strings.TrimSpace(string(c)); got != comm {
			return nil, fmt.Errorf("%s: pid %d from %s runs %q, not %q (a stale pid file?)", name, pid, pf, got, comm)
		}
		out = append(out, Process{Name: name, Pid: pid})
	}
	return out, nil
}

// serverCPU is the main tables' "server CPU µs/cycle" cell.
func (r Result) serverCPU() string {
	if len(r.Procs) == 0 {
		return "–"
	}
	return f1(r.ServerCPUus)
}

// cpuSection writes results.md's per-process CPU breakdown.
func (r *Report) cpuSection(b *bytes.Buffer) {
	var rows []string
	for _, w := range r.Config.Workloads {
		for _, n := range r.Config.Clients {
			for _, s := range r.Config.Systems {
				x, ok := r.find(s, w, n)
				if !ok {
					continue
				}
				if len(x.Procs) == 0 {
					rows = append(rows, fmt.Sprintf("| %s | %s | %d | – | %s | | |", s, w, n, mdCell(orDash(x.CPUNote))))
					continue
				}
				busy := "–"
				if x.Seconds > 0 {
					busy = fmt.Sprintf("%.2f", (x.ServerCPUms+x.HarnessCPUms)/(1000*x.Seconds))
				}
				rows = append(rows, fmt.Sprintf("| %s | %s | %d | %s | %s | %s | %s |", s, w, n, f1(x.ServerCPUus), x.procList(), f1(x.HarnessCPUus), busy))
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("## CPU per cycle, per process\n\n")
	fmt.Fprintf(b, "User + system time of each server process, all its threads (`/proc/PID/stat`, %d ticks/s), over the measured window only, "+
		"÷ the window's cycles (grants when contended), in µs. Server: the sum of the processes listed (ticketing-sidecar: the 3 nodes and the sidecar; "+
		"ticketing-broker: the 3 nodes, its Broker runs in the harness). Harness: this process (`/proc/self/stat`): the clients, and for "+
		"ticketing-broker the in-process Broker. The leader is the one the nodes named at the run's start. Cores busy: server + harness CPU ÷ the window.\n\n", clockTicks())
	b.WriteString("| system | workload | clients | server µs/cycle | per process µs/cycle | harness µs/cycle | cores busy |\n| --- | --- | ---: | ---: | --- | ---: | ---: |\n")
	b.WriteString(strings.Join(rows, "\n") + "\n\n")
}
