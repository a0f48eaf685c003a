package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Subprocess is a baseline that lives in a Go module of its own under
// internal/bench, so that arbor never depends on it: DBOS Transact Go
// (internal/bench/dbos) and go-workflows (internal/bench/goworkflows). It
// is built once per run and run as a subprocess at each size; the
// subprocess measures its workload itself (after its own set-up and
// migrations), counting its statements and the server's counters the way
// the harness does, and prints them as one JSON object.
type Subprocess struct {
	mod     module
	bin     string
	tmp     string
	peakRSS int64
}

// module names one of the subprocess modules.
type module struct {
	// key is the subjects' Subject.Subprocess and the binary's name.
	key string
	// name is what it runs, as the table's notes say it.
	name string
	// path is its directory in the repository; flag the command line's
	// flag that says where it is.
	path, flag string
}

var (
	dbosModule        = module{key: "dbos", name: "DBOS Transact Go", path: "internal/bench/dbos", flag: "--dbos-dir"}
	goWorkflowsModule = module{key: "goworkflows", name: "go-workflows", path: "internal/bench/goworkflows", flag: "--goworkflows-dir"}
)

// buildSubprocess builds the module m in dir. When it cannot (no
// directory, no go command, the module or its dependencies cannot be
// fetched or do not build), it returns nil and the reason, which the table
// shows instead of the subjects' figures.
func buildSubprocess(ctx context.Context, m module, dir string, logger *slog.Logger) (*Subprocess, string) {
	if dir == "" {
		return nil, fmt.Sprintf("not run: no %s directory given (%s)", m.path, m.flag)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return nil, fmt.Sprintf("not run: %s/go.mod not found", dir)
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return nil, "not run: no go command to build " + m.path
	}
	tmp, err := os.MkdirTemp("", "arbor-"+m.key+"-bench-")
	if err != nil {
		return nil, "not run: " + err.Error()
	}
	bin := filepath.Join(tmp, m.key+"-bench")
	logger.InfoContext(ctx, "bench: building a subprocess", slog.String("module", m.path), slog.String("dir", dir))
	started := time.Now()
	cmd := exec.CommandContext(ctx, goCmd, "build", "-o", bin, ".")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(tmp)
		return nil, fmt.Sprintf("could not build %s (%s): %v: %s", m.path, m.name, err, lastLines(string(out), 3))
	}
	logger.InfoContext(ctx, "bench: built a subprocess", slog.String("module", m.path), slog.Duration("took", time.Since(started)))
	return &Subprocess{mod: m, bin: bin, tmp: tmp}, ""
}

// Close removes the built binary.
func (p *Subprocess) Close() { _ = os.RemoveAll(p.tmp) }

// run runs the subprocess for one size with the harness's database and
// connections and args, reads its JSON result and checks it did the size's
// tasks. The note names the subject and its version, then detail.
func (p *Subprocess) run(ctx context.Context, env *Env, size Size, detail string, args ...string) (Measurement, error) {
	args = append([]string{"-url", env.URL, "-conns", strconv.Itoa(env.Conns)}, args...)
	cmd := exec.CommandContext(ctx, p.bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return Measurement{}, fmt.Errorf("%s subprocess: %v: %s", p.mod.key, err, lastLines(stderr.String(), 3))
	}
	var res struct {
		ElapsedNS   int64  `json:"elapsed_ns"`
		Tasks       int    `json:"tasks"`
		Statements  int64  `json:"statements"`
		XIDs        int64  `json:"xids"`
		WALBytes    int64  `json:"wal_bytes"`
		WALStartLSN string `json:"wal_start_lsn"`
		WALEndLSN   string `json:"wal_end_lsn"`
		ClientCPUNS int64  `json:"client_cpu_ns"`
		ServerCPUNS int64  `json:"server_cpu_ns"`
		// Version is the subject's module version; the DBOS subprocess
		// names it DBOSVersion.
		Version      string `json:"version"`
		DBOSVersion  string `json:"dbos_version"`
		PeakRSSBytes int64  `json:"peak_rss_bytes"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return Measurement{}, fmt.Errorf("%s subprocess: read its result %q: %w", p.mod.key, stdout.String(), err)
	}
	p.peakRSS = max(p.peakRSS, res.PeakRSSBytes)
	if res.Tasks != size.Tasks {
		return Measurement{}, fmt.Errorf("%s subprocess: %d tasks done, want %d", p.mod.key, res.Tasks, size.Tasks)
	}
	version := res.Version
	if version == "" {
		version = res.DBOSVersion
	}
	return Measurement{
		Elapsed:    time.Duration(res.ElapsedNS),
		Tasks:      res.Tasks,
		Statements: res.Statements,
		Commits:    env.commitsBetween(ctx, res.WALStartLSN, res.WALEndLSN),
		XIDs:       res.XIDs,
		WALBytes:   res.WALBytes,
		ClientCPU:  time.Duration(res.ClientCPUNS),
		ServerCPU:  time.Duration(res.ServerCPUNS),
		counted:    true,
		Note:       p.mod.name + " " + version + detail + ", in a subprocess",
	}, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
