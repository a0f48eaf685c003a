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

// DBOS runs the DBOS Transact Go side of scenario (b): the internal/bench/dbos
// module (a Go module of its own, so that arbor never depends on DBOS), built
// once per run and run as a subprocess for each size.
type DBOS struct {
	bin     string
	tmp     string
	peakRSS int64
	logger  *slog.Logger
}

// prepareDBOS builds the internal/bench/dbos module in dir. When it cannot (no
// directory, no go command, the module or DBOS cannot be fetched or does not
// build), it returns nil and the reason, which the table shows instead of
// DBOS's figures.
func prepareDBOS(ctx context.Context, dir string, logger *slog.Logger) (*DBOS, string) {
	if dir == "" {
		return nil, "not run: no internal/bench/dbos directory given (--dbos-dir)"
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return nil, fmt.Sprintf("not run: %s/go.mod not found", dir)
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return nil, "not run: no go command to build internal/bench/dbos"
	}
	tmp, err := os.MkdirTemp("", "arbor-dbos-bench-")
	if err != nil {
		return nil, "not run: " + err.Error()
	}
	bin := filepath.Join(tmp, "dbos-bench")
	logger.InfoContext(ctx, "bench: building the DBOS subprocess", slog.String("dir", dir))
	started := time.Now()
	cmd := exec.CommandContext(ctx, goCmd, "build", "-o", bin, ".")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(tmp)
		return nil, fmt.Sprintf("could not build internal/bench/dbos (DBOS Transact Go): %v: %s", err, lastLines(string(out), 3))
	}
	logger.InfoContext(ctx, "bench: built the DBOS subprocess", slog.Duration("took", time.Since(started)))
	return &DBOS{bin: bin, tmp: tmp, logger: logger}, ""
}

// Close removes the built binary.
func (d *DBOS) Close() { _ = os.RemoveAll(d.tmp) }

// run runs the subprocess for one size and reads its JSON result.
func (d *DBOS) run(ctx context.Context, env *Env, schema string, size Size) (Measurement, error) {
	cmd := exec.CommandContext(ctx, d.bin, "-url", env.URL, "-schema", schema, "-conns", strconv.Itoa(env.Conns),
		"-parents", strconv.Itoa(size.P), "-children", strconv.Itoa(size.C))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return Measurement{}, fmt.Errorf("dbos subprocess: %v: %s", err, lastLines(stderr.String(), 3))
	}
	var res struct {
		ElapsedNS    int64  `json:"elapsed_ns"`
		Tasks        int    `json:"tasks"`
		Statements   int64  `json:"statements"`
		XIDs         int64  `json:"xids"`
		WALBytes     int64  `json:"wal_bytes"`
		WALStartLSN  string `json:"wal_start_lsn"`
		WALEndLSN    string `json:"wal_end_lsn"`
		ClientCPUNS  int64  `json:"client_cpu_ns"`
		ServerCPUNS  int64  `json:"server_cpu_ns"`
		DBOSVersion  string `json:"dbos_version"`
		PeakRSSBytes int64  `json:"peak_rss_bytes"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return Measurement{}, fmt.Errorf("dbos subprocess: read its result %q: %w", stdout.String(), err)
	}
	d.peakRSS = max(d.peakRSS, res.PeakRSSBytes)
	if res.Tasks != size.Tasks {
		return Measurement{}, fmt.Errorf("dbos subprocess: %d workflows succeeded, want %d", res.Tasks, size.Tasks)
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
		Note:       "DBOS Transact Go " + res.DBOSVersion + ", in a subprocess",
	}, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
