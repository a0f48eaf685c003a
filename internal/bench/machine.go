package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Machine describes where a run ran: the figures mean nothing without it.
type Machine struct {
	NumCPU            int    `json:"num_cpu"`
	CPUModel          string `json:"cpu_model"`
	MemTotalBytes     int64  `json:"mem_total_bytes"`
	GOOS              string `json:"goos"`
	GOARCH            string `json:"goarch"`
	GoVersion         string `json:"go_version"`
	PostgresVersion   string `json:"postgres_version"`
	Fsync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
	SharedBuffers     string `json:"shared_buffers"`
	// Revision is the git commit the run was built from (with "+dirty"
	// when the work tree had changes), "" when git cannot say: what a
	// comparison of two result files needs first.
	Revision string `json:"revision,omitempty"`
}

func readMachine(ctx context.Context, pool *pgxpool.Pool) (Machine, error) {
	m := Machine{
		NumCPU:    runtime.NumCPU(),
		GOOS:      runtime.GOOS,
		GOARCH:    runtime.GOARCH,
		GoVersion: runtime.Version(),
		CPUModel:  procField("/proc/cpuinfo", "model name"),
	}
	if kb, err := strconv.ParseInt(strings.Fields(procField("/proc/meminfo", "MemTotal") + " 0")[0], 10, 64); err == nil {
		m.MemTotalBytes = kb << 10
	}
	m.Revision = gitRevision(ctx)
	err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('synchronous_commit'), current_setting('shared_buffers')`).
		Scan(&m.PostgresVersion, &m.Fsync, &m.SynchronousCommit, &m.SharedBuffers)
	if err != nil {
		return m, fmt.Errorf("read server settings: %w", err)
	}
	return m, nil
}

// gitRevision returns the current commit of the work tree the harness runs
// in, or "".
func gitRevision(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	if status, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(status) > 0 {
		rev += "+dirty"
	}
	return rev
}

// procField returns the value of the first "key: value" line of a /proc
// file, or "unknown".
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// peakRSS returns this process's peak resident memory in bytes: VmHWM of
// /proc/self/status, which belongs to this program's own address space.
// getrusage's maxrss is the fallback: Linux carries the high-water mark of
// the address space a process had before exec over into it, so for a
// process started by a Go program it can report the parent's memory.
func peakRSS() int64 {
	if kb, err := strconv.ParseInt(strings.TrimSuffix(procField("/proc/self/status", "VmHWM"), " kB"), 10, 64); err == nil {
		return kb << 10
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Maxrss << 10
}
