// Package cputime says where a benchmark's cost goes on a small machine:
// into the client (arbor's, River's, DBOS's or go-workflows' Go code, pgx)
// or into the server (PostgreSQL's backends, its WAL writer and
// checkpointer). It reads getrusage for the client and /proc for a server on
// the same machine.
//
// It is the one copy every benchmark harness uses: internal/bench, and the
// subprocess subjects internal/bench/dbos (DBOS) and
// internal/bench/goworkflows (go-workflows), each a Go module of its own (so
// that arbor never depends on them) that requires arbor's module through a
// replace of the checkout and imports this package — an internal package of
// arbor's module path, which Go lets a module under that path import.
package cputime

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clockTick is USER_HZ, the unit of the CPU times in /proc: 100 on every
// Linux this runs on.
const clockTick = 10 * time.Millisecond

// Client returns the CPU time this process has used so far.
func Client() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// FindPostmaster returns the pid of the PostgreSQL server's postmaster when
// the server runs on this machine where /proc shows it, else 0: a
// backend's parent, both named postgres.
func FindPostmaster(ctx context.Context, pool *pgxpool.Pool) int {
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0
	}
	st, ok := procStat(backend)
	if !ok || st.comm != "postgres" {
		return 0
	}
	pm, ok := procStat(st.ppid)
	if !ok || pm.comm != "postgres" {
		return 0
	}
	return st.ppid
}

// Server returns the CPU time the server has used so far: the
// postmaster's own, its live children's and its reaped children's
// (backends that exited). ok is false when it cannot be read.
func Server(postmaster int) (time.Duration, bool) {
	if postmaster == 0 {
		return 0, false
	}
	pm, ok := procStat(postmaster)
	if !ok {
		return 0, false
	}
	ticks := pm.utime + pm.stime + pm.cutime + pm.cstime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := procStat(pid); ok && st.ppid == postmaster {
			ticks += st.utime + st.stime
		}
	}
	return time.Duration(ticks) * clockTick, true
}

type stat struct {
	comm                         string
	ppid                         int
	utime, stime, cutime, cstime int64
}

// procStat reads /proc/pid/stat.
func procStat(pid int) (stat, bool) {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return stat{}, false
	}
	s := string(raw)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return stat{}, false
	}
	// After the command: state ppid pgrp session tty_nr tpgid flags minflt
	// cminflt majflt cmajflt utime stime cutime cstime …
	f := strings.Fields(s[closing+1:])
	if len(f) < 15 {
		return stat{}, false
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	return stat{comm: s[open+1 : closing], ppid: int(n(1)), utime: n(11), stime: n(12), cutime: n(13), cstime: n(14)}, true
}
