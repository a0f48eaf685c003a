package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/internal/cputime"
)

// soakTables are the tables the soak samples: arbor's, and River's job
// table (wake jobs, and the periodic prune jobs themselves).
var soakTables = []string{"tasks", "events", "conversation_log", "conversations", "river_job", "budgets", "budget_reservations"}

// The verdict's tolerances: the last interval against the one half-way
// through the steady part (see soakVerdict).
const (
	// soakSizeFactor and soakSizeSlack bound a table's total and index
	// size: last ≤ factor × first + slack (the slack for the small tables,
	// where a page or two is a large ratio).
	soakSizeFactor       = 1.5
	soakSizeSlack  int64 = 256 << 10
	// soakRowsSlack is the slack of the row counts (river_job keeps a
	// periodic prune job's row for River's retention of completed jobs, a
	// day by default: PruneInterval 5 s adds a dozen rows a minute).
	soakRowsSlack int64 = 100
	// soakP99Factor bounds the last interval's p99: ≤ factor × the first's.
	soakP99Factor = 2.0
	// soakKeptUp: the last interval must complete at least this share of
	// the turns created in it.
	soakKeptUp = 0.8
)

// SoakReport is what a soak measured.
type SoakReport struct {
	Machine   Machine           `json:"machine"`
	Options   SoakReportOptions `json:"options"`
	StartedAt time.Time         `json:"started_at"`
	// Schema is the soak's schema (dropped when Soak returns).
	Schema  string            `json:"schema"`
	Elapsed time.Duration     `json:"elapsed_ns"`
	Samples []SoakSample      `json:"samples"`
	Steady  SoakSteady        `json:"steady"`
	End     SoakEnd           `json:"end"`
	Verdict SoakVerdictResult `json:"verdict"`
	Flat    bool              `json:"flat"`
	// Autovacuum and AutovacuumNaptime are the server's settings.
	Autovacuum        string        `json:"autovacuum"`
	AutovacuumNaptime time.Duration `json:"autovacuum_naptime_ns"`
	// PeakRSSBytes is the harness process's peak resident memory.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
}

// SoakReportOptions are the options that shape the figures.
type SoakReportOptions struct {
	Duration       time.Duration `json:"duration_ns"`
	Interval       time.Duration `json:"interval_ns"`
	Warmup         time.Duration `json:"warmup_ns"`
	Rate           float64       `json:"rate"`
	Retention      time.Duration `json:"retention_ns"`
	PruneInterval  time.Duration `json:"prune_interval_ns"`
	PruneOlderThan time.Duration `json:"prune_older_than_ns,omitempty"`
	ThinkTime      time.Duration `json:"think_time_ns"`
	Conns          int           `json:"conns"`
}

func soakReportOptions(o *SoakOptions) SoakReportOptions {
	r := SoakReportOptions{Duration: o.Duration, Interval: o.Interval, Warmup: o.Warmup, Rate: o.Rate,
		PruneInterval: o.PruneInterval, PruneOlderThan: o.PruneOlderThan, ThinkTime: o.ThinkTime, Conns: o.Conns}
	if o.PruneOlderThan == 0 {
		r.Retention = o.Retention
	}
	return r
}

// SoakSample is one interval: what the workload did in it, and the tables
// as they stood at its end.
type SoakSample struct {
	// Index is the interval's number (0: the sample before the producer
	// started); From and To its bounds since the start.
	Index int           `json:"index"`
	From  time.Duration `json:"from_ns"`
	To    time.Duration `json:"to_ns"`
	// Created and Completed count the turns created and completed in the
	// interval; Timeouts those that had not settled soakTurnTimeout after
	// their create.
	Created   int `json:"created"`
	Completed int `json:"completed"`
	Timeouts  int `json:"timeouts"`
	// TurnsPerSec and TasksPerSec are the completed turns (and their
	// tasks) per second.
	TurnsPerSec float64 `json:"turns_per_sec"`
	TasksPerSec float64 `json:"tasks_per_sec"`
	// P50, P99 and Max are the create→settled latency of the turns that
	// completed in the interval: Engine.Create's return to the return of
	// the turn handler's Complete.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
	// Prunes are the prune runs that ended in the interval, and what they
	// deleted.
	Prunes              int64 `json:"prunes"`
	PrunedConversations int64 `json:"pruned_conversations"`
	PrunedTurns         int64 `json:"pruned_turns"`
	PrunedTasks         int64 `json:"pruned_tasks"`
	// ClientCPU and ServerCPU are the CPU the harness process and the
	// PostgreSQL server used, in cores (1.0: one core all the interval; the
	// server's -1 when it is not on this machine).
	ClientCPU float64 `json:"client_cpu_cores"`
	ServerCPU float64 `json:"server_cpu_cores"`
	// Statements are the round trips of the workload's pool.
	Statements int64       `json:"statements"`
	Tables     []SoakTable `json:"tables"`
}

// SoakTable is one table at a sample.
type SoakTable struct {
	Name string `json:"name"`
	// TotalBytes is pg_total_relation_size (heap, indexes, TOAST),
	// IndexBytes pg_indexes_size.
	TotalBytes int64 `json:"total_bytes"`
	IndexBytes int64 `json:"index_bytes"`
	// Rows is count(*) at the sample. Dead is the most dead tuples
	// (pg_stat_user_tables.n_dead_tup) read in the interval: they are read
	// every few seconds between the samples (soakDeadEvery), since they
	// rise and fall with each autovacuum.
	Rows int64 `json:"rows"`
	Dead int64 `json:"dead"`
	// Autovacuums is pg_stat_user_tables.autovacuum_count so far.
	Autovacuums int64 `json:"autovacuums"`
	// VacuumTrigger is the dead tuples at which autovacuum takes the table
	// (autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor ×
	// reltuples).
	VacuumTrigger int64 `json:"vacuum_trigger"`
}

// SoakSteady is what the workload cost the database per completed turn
// from the end of the warm-up to the end.
type SoakSteady struct {
	Turns             int     `json:"turns"`
	StatementsPerTurn float64 `json:"statements_per_turn"`
	// CommitsPerTurn is -1 when pg_walinspect is not available.
	CommitsPerTurn  float64 `json:"commits_per_turn"`
	WALBytesPerTurn float64 `json:"wal_bytes_per_turn"`
}

func soakSteady(m Measurement, turns int) SoakSteady {
	if turns == 0 {
		return SoakSteady{}
	}
	n := float64(turns)
	s := SoakSteady{Turns: turns, StatementsPerTurn: float64(m.Statements) / n, CommitsPerTurn: -1,
		WALBytesPerTurn: float64(m.WALBytes) / n}
	if m.Commits >= 0 {
		s.CommitsPerTurn = float64(m.Commits) / n
	}
	return s
}

// SoakEnd is what was checked after the last turn settled.
type SoakEnd struct {
	// TurnsCreated and TurnsCompleted count the turns of the whole soak,
	// those that settled after the last sample included.
	TurnsCreated   int `json:"turns_created"`
	TurnsCompleted int `json:"turns_completed"`
	// TasksLeft are the tasks not pruned; TasksNotCompleted those of them
	// not completed (failed, aborted, cancelled, or still live).
	TasksLeft         int64 `json:"tasks_left"`
	TasksNotCompleted int64 `json:"tasks_not_completed"`
	// Violations of the invariant checker (tasks.Engine.Check) over every
	// conversation left.
	Violations     int    `json:"violations"`
	FirstViolation string `json:"first_violation,omitempty"`
	// Timeouts are turns that never settled; HarnessErrors creates and
	// emits that failed; PruneErrors failed prunes of the harness's loop.
	Timeouts          int    `json:"timeouts"`
	HarnessErrors     int    `json:"harness_errors"`
	PruneErrors       int    `json:"prune_errors"`
	FirstHarnessError string `json:"first_harness_error,omitempty"`
	// Warnings and Errors are the records the runner (and River) logged.
	Warnings      int64  `json:"warnings"`
	Errors        int64  `json:"errors"`
	FirstLogError string `json:"first_log_error,omitempty"`
}

// SoakVerdictResult compares the last interval with the first after the
// warm-up.
type SoakVerdictResult struct {
	// First and Last are the indexes of the samples compared.
	First int `json:"first_index"`
	Last  int `json:"last_index"`
	// DeadWindow is the intervals of each window whose dead tuples' peaks
	// are compared.
	DeadWindow int         `json:"dead_window"`
	Checks     []SoakCheck `json:"checks"`
	Flat       bool        `json:"flat"`
}

// SoakCheck is one line of the verdict.
type SoakCheck struct {
	Name  string  `json:"name"`
	First float64 `json:"first"`
	Last  float64 `json:"last"`
	// Limit is the most Last may be (the least, with AtLeast).
	Limit   float64 `json:"limit"`
	AtLeast bool    `json:"at_least,omitempty"`
	Unit    string  `json:"unit"`
	OK      bool    `json:"ok"`
}

// soakVerdict compares the last sample with the one half-way between the
// end of the warm-up (samples[firstSteady]) and the last: sizes, rows and
// the latency point against point.
// Dead tuples rise between two autovacuums of a table and fall at each, a
// sawtooth whose period is autovacuum_naptime (a minute by default), so a
// point compared with a point would say more about where each fell in its
// cycle than about growth: they are compared as the peak of the last
// window against the peak of the first window after the warm-up, each
// window the intervals that cover naptime (a whole cycle; shorter when the
// soak is too short for two windows that do not overlap), each interval's
// figure its peak (see SoakTable.Dead).
func soakVerdict(samples []SoakSample, firstSteady int, naptime time.Duration, end SoakEnd) SoakVerdictResult {
	// The reference is half-way through the steady part, not its start:
	// an index of a table whose rows are deleted as fast as they are
	// inserted grows until vacuum has recycled its emptied pages (two
	// vacuums after their rows went), minutes after the rows level off,
	// and a growth that levels off is not one that goes on. A 12-minute
	// soak showed it: tasks' indexes 0.8 MiB at 1m40s, 1.4 MiB at 4m, 1.5
	// MiB from 7m to 12m.
	firstSteady = max(firstSteady, (firstSteady+len(samples)-1)/2)
	first, last := samples[firstSteady], samples[len(samples)-1]
	v := SoakVerdictResult{First: first.Index, Last: last.Index, Flat: true}
	steady := samples[firstSteady:]
	win := 1
	if first.To > first.From {
		interval := first.To - first.From
		win = int((naptime + interval - 1) / interval)
	}
	win = max(1, min(win, len(steady)/2))
	v.DeadWindow = win
	peakDead := func(ss []SoakSample, table int) (peak, trigger int64) {
		for _, s := range ss {
			peak = max(peak, s.Tables[table].Dead)
			trigger = max(trigger, s.Tables[table].VacuumTrigger)
		}
		return peak, trigger
	}
	add := func(c SoakCheck) {
		if c.AtLeast {
			c.OK = c.Last >= c.Limit
		} else {
			c.OK = c.Last <= c.Limit
		}
		v.Flat = v.Flat && c.OK
		v.Checks = append(v.Checks, c)
	}
	for i, f := range first.Tables {
		l := last.Tables[i]
		add(SoakCheck{Name: f.Name + " total size", First: float64(f.TotalBytes), Last: float64(l.TotalBytes),
			Limit: soakSizeFactor*float64(f.TotalBytes) + float64(soakSizeSlack), Unit: "bytes"})
		add(SoakCheck{Name: f.Name + " index size", First: float64(f.IndexBytes), Last: float64(l.IndexBytes),
			Limit: soakSizeFactor*float64(f.IndexBytes) + float64(soakSizeSlack), Unit: "bytes"})
		add(SoakCheck{Name: f.Name + " rows", First: float64(f.Rows), Last: float64(l.Rows),
			Limit: soakSizeFactor*float64(f.Rows) + float64(soakRowsSlack), Unit: "rows"})
		fd, ft := peakDead(steady[:win], i)
		ld, lt := peakDead(steady[len(steady)-win:], i)
		add(SoakCheck{Name: f.Name + " dead tuples (peak)", First: float64(fd), Last: float64(ld),
			Limit: soakSizeFactor*float64(fd) + float64(max(ft, lt)), Unit: "rows"})
	}
	add(SoakCheck{Name: "turn latency p99", First: micros(first.P99) / 1e3, Last: micros(last.P99) / 1e3,
		Limit: soakP99Factor * micros(first.P99) / 1e3, Unit: "ms"})
	add(SoakCheck{Name: "turns completed of those created", First: float64(last.Created), Last: float64(last.Completed),
		Limit: soakKeptUp * float64(last.Created), AtLeast: true, Unit: "turns"})
	for _, c := range []struct {
		name string
		n    int64
	}{
		{"turns timed out (whole soak)", int64(end.Timeouts)},
		{"creates and emits failed (whole soak)", int64(end.HarnessErrors)},
		{"prunes failed (whole soak)", int64(end.PruneErrors)},
		{"errors logged (whole soak)", end.Errors},
		{"tasks left not completed (end)", end.TasksNotCompleted},
		{"invariant violations (end)", int64(end.Violations)},
	} {
		add(SoakCheck{Name: c.name, Last: float64(c.n), Limit: 0, Unit: "count"})
	}
	return v
}

// soakSampler takes the samples.
type soakSampler struct {
	env   *Env
	pool  *pgxpool.Pool
	o     *SoakOptions
	w     *soakWorkload
	start time.Time

	stmts0              int64
	clientCPU0, server0 time.Duration
	serverOK            bool
	lastAt              time.Time
	rowsQuery           string
	// deadPeak is the most dead tuples of each table read since the last
	// sample.
	deadPeak map[string]int64
}

// soakDeadEvery is how often dead tuples are read between two samples (a
// quarter of the interval when that is shorter).
const soakDeadEvery = 5 * time.Second

// watchDead reads the tables' dead tuples every soakDeadEvery until the
// next sample is due, keeping each table's peak.
func (s *soakSampler) watchDead(ctx context.Context, until time.Time) error {
	every := min(soakDeadEvery, s.o.Interval/4)
	for {
		next := time.Now().Add(every)
		if !next.Before(until) {
			return sleepCtx(ctx, time.Until(until))
		}
		if err := sleepCtx(ctx, time.Until(next)); err != nil {
			return err
		}
		rows, err := s.pool.Query(ctx, `SELECT relname::text, n_dead_tup FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname = ANY($2)`, s.env.Schema, soakTables)
		if err != nil {
			return fmt.Errorf("read the dead tuples: %w", err)
		}
		for rows.Next() {
			var name string
			var dead int64
			if err := rows.Scan(&name, &dead); err != nil {
				rows.Close()
				return fmt.Errorf("read the dead tuples: %w", err)
			}
			s.deadPeak[name] = max(s.deadPeak[name], dead)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read the dead tuples: %w", err)
		}
	}
}

// sample ends interval k (0: the baseline before the producer starts,
// which also starts the clock).
func (s *soakSampler) sample(ctx context.Context, k int, to time.Duration) (SoakSample, error) {
	now := time.Now()
	if k == 0 {
		s.start = now
		s.lastAt = now
		s.stmts0 = s.env.counter.statements.Load()
		s.clientCPU0 = cputime.Client()
		s.server0, s.serverOK = cputime.Server(s.env.postmaster)
		parts := make([]string, len(soakTables))
		for i, t := range soakTables {
			parts[i] = "(SELECT count(*) FROM " + pgx.Identifier{s.env.Schema, t}.Sanitize() + ")"
		}
		s.rowsQuery = "SELECT " + strings.Join(parts, ", ")
	}
	smp := SoakSample{Index: k, From: max(0, to-s.o.Interval), To: to}
	if k == 0 {
		smp.From = 0
	}
	b := s.w.take()
	smp.Created, smp.Completed, smp.Timeouts = b.created, b.completed, b.timeouts
	smp.Prunes, smp.PrunedConversations, smp.PrunedTurns, smp.PrunedTasks = b.prunes, b.prunedConversations, b.prunedTurns, b.prunedTasks
	secs := now.Sub(s.lastAt).Seconds()
	if k > 0 && secs > 0 {
		smp.TurnsPerSec = float64(b.completed) / secs
		smp.TasksPerSec = smp.TurnsPerSec * soakTasksPerTurn
		cpu := cputime.Client()
		smp.ClientCPU = (cpu - s.clientCPU0).Seconds() / secs
		s.clientCPU0 = cpu
		smp.ServerCPU = -1
		if srv, ok := cputime.Server(s.env.postmaster); ok && s.serverOK {
			smp.ServerCPU = (srv - s.server0).Seconds() / secs
			s.server0 = srv
		}
		st := s.env.counter.statements.Load()
		smp.Statements = st - s.stmts0
		s.stmts0 = st
	}
	s.lastAt = now
	if len(b.latencies) > 0 {
		smp.P50, smp.P99, smp.Max = percentile(b.latencies, 0.5), percentile(b.latencies, 0.99), slices.Max(b.latencies)
	}

	byName := map[string]*SoakTable{}
	smp.Tables = make([]SoakTable, len(soakTables))
	for i, t := range soakTables {
		smp.Tables[i].Name = t
		byName[t] = &smp.Tables[i]
	}
	rows, err := s.pool.Query(ctx, `SELECT c.relname::text, pg_total_relation_size(c.oid), pg_indexes_size(c.oid),
			coalesce(st.n_dead_tup, 0), coalesce(st.autovacuum_count, 0),
			(current_setting('autovacuum_vacuum_threshold')::float8
				+ current_setting('autovacuum_vacuum_scale_factor')::float8 * greatest(c.reltuples, 0))::bigint
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
		WHERE n.nspname = $1 AND c.relname = ANY($2) AND c.relkind IN ('r', 'p')`, s.env.Schema, soakTables)
	if err != nil {
		return smp, fmt.Errorf("sample the tables: %w", err)
	}
	for rows.Next() {
		var name string
		var t SoakTable
		if err := rows.Scan(&name, &t.TotalBytes, &t.IndexBytes, &t.Dead, &t.Autovacuums, &t.VacuumTrigger); err != nil {
			rows.Close()
			return smp, fmt.Errorf("sample the tables: %w", err)
		}
		if p := byName[name]; p != nil {
			t.Name = name
			t.Dead = max(t.Dead, s.deadPeak[name])
			*p = t
		}
	}
	if err := rows.Err(); err != nil {
		return smp, fmt.Errorf("sample the tables: %w", err)
	}
	s.deadPeak = map[string]int64{}
	counts := make([]any, len(soakTables))
	for i := range smp.Tables {
		counts[i] = &smp.Tables[i].Rows
	}
	if err := s.pool.QueryRow(ctx, s.rowsQuery).Scan(counts...); err != nil {
		return smp, fmt.Errorf("count the rows: %w", err)
	}
	return smp, nil
}

// WriteJSON writes the report to path, indented.
func (r *SoakReport) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func printSoakHeader(w io.Writer, r *SoakReport) {
	m, o := r.Machine, r.Options
	fmt.Fprintf(w, "arbor soak — %s", r.StartedAt.Format(time.RFC3339))
	if m.Revision != "" {
		fmt.Fprintf(w, ", revision %s", m.Revision)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "machine: %d cores (%s), %s memory, %s/%s, %s\n", m.NumCPU, m.CPUModel,
		bytesText(m.MemTotalBytes), m.GOOS, m.GOARCH, m.GoVersion)
	fmt.Fprintf(w, "postgres: %s, fsync=%s, synchronous_commit=%s, shared_buffers=%s\n",
		m.PostgresVersion, m.Fsync, m.SynchronousCommit, m.SharedBuffers)
	prune := fmt.Sprintf("the runner's periodic prune job (tasks.Config.Retention %s, PruneInterval %s)", o.Retention, o.PruneInterval)
	if o.PruneOlderThan > 0 {
		prune = fmt.Sprintf("the harness's loop of Engine.Prune(OlderThan %s) every %s", o.PruneOlderThan, o.PruneInterval)
	}
	for _, line := range wrap(fmt.Sprintf("soak: %s, sampled every %s, warm-up %s; a machine.Runner with RunnerConfig{} (only the logger set), "+
		"%d connections; %.1f turns/s offered: %.1f new conversations/s of 1–%d turns, %s to %s apart; a turn reserves and records tokens "+
		"(its budget and the conversation's), publishes %d progress entries, makes %d tool calls (each spends one tool_calls of the "+
		"conversation's budget; in one turn in %d the first sleeps %s) and waits on them (all_settled); one turn in %d then awaits an event the "+
		"producer emitted to it; prune: %s", o.Duration, o.Interval, o.Warmup, o.Conns, o.Rate, o.Rate/soakMeanTurns, soakMaxTurns,
		o.ThinkTime/4, o.ThinkTime, soakProgress, soakToolCalls, soakSleepEvery, soakSleep, soakAwaitEvery, prune), 110) {
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w)
}

// printSoakSample prints one interval's table.
func printSoakSample(w io.Writer, s SoakSample) {
	if s.Index == 0 {
		fmt.Fprintf(w, "interval 0 (before the producer starts)\n")
	} else {
		server := "?"
		if s.ServerCPU >= 0 {
			server = fmt.Sprintf("%.2f", s.ServerCPU)
		}
		fmt.Fprintf(w, "interval %d (%s–%s): turns created %d, completed %d (%.1f turns/s, %.0f tasks/s), timed out %d; "+
			"latency p50 %.1f ms, p99 %.1f ms, max %.1f ms; prune runs %d deleted %d conversations, %d turns, %d tasks; "+
			"CPU cores client %.2f, server %s; statements %d\n",
			s.Index, s.From, s.To, s.Created, s.Completed, s.TurnsPerSec, s.TasksPerSec, s.Timeouts,
			micros(s.P50)/1e3, micros(s.P99)/1e3, micros(s.Max)/1e3, s.Prunes, s.PrunedConversations, s.PrunedTurns, s.PrunedTasks,
			s.ClientCPU, server, s.Statements)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  table\ttotal\tindexes\trows\tdead (peak)\tautovacuums\t")
	for _, t := range s.Tables {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%d\t\n", t.Name, bytesText(t.TotalBytes), bytesText(t.IndexBytes), t.Rows, t.Dead, t.Autovacuums)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
}

// printSoakEnd prints the series of every interval, the verdict and the
// end's checks.
func printSoakEnd(w io.Writer, r *SoakReport) {
	fmt.Fprintf(w, "series (sizes: total relation size, KiB; rows of tasks, and its dead tuples' peak in the interval):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"  t", "turns/s", "p50 ms", "p99 ms", "pruned turns"}
	head = append(head, soakTables...)
	head = append(head, "tasks rows", "tasks dead")
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, s := range r.Samples {
		row := []string{"  " + s.To.String(), fmt.Sprintf("%.1f", s.TurnsPerSec), fmt.Sprintf("%.1f", micros(s.P50)/1e3),
			fmt.Sprintf("%.1f", micros(s.P99)/1e3), fmt.Sprint(s.PrunedTurns)}
		for _, t := range s.Tables {
			row = append(row, fmt.Sprint(t.TotalBytes>>10))
		}
		row = append(row, fmt.Sprint(s.Tables[0].Rows), fmt.Sprint(s.Tables[0].Dead))
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	_ = tw.Flush()
	fmt.Fprintln(w)

	st := r.Steady
	commits := "?"
	if st.CommitsPerTurn >= 0 {
		commits = fmt.Sprintf("%.2f", st.CommitsPerTurn)
	}
	fmt.Fprintf(w, "after the warm-up: %d turns, per turn %.1f statements, %s commits, %.0f WAL bytes (prune and the runner's upkeep included)\n",
		st.Turns, st.StatementsPerTurn, commits, st.WALBytesPerTurn)
	e := r.End
	fmt.Fprintf(w, "at the end: %d turns created, %d completed; %d tasks left (not pruned), %d of them not completed; "+
		"invariant violations %d; warnings logged %d, errors %d\n", e.TurnsCreated, e.TurnsCompleted, e.TasksLeft,
		e.TasksNotCompleted, e.Violations, e.Warnings, e.Errors)
	for _, s := range []string{e.FirstViolation, e.FirstHarnessError, e.FirstLogError} {
		if s != "" {
			fmt.Fprintf(w, "  first: %s\n", s)
		}
	}
	fmt.Fprintln(w)

	v := r.Verdict
	first, last := r.Samples[v.First], r.Samples[v.Last]
	for _, line := range wrap(fmt.Sprintf("verdict: interval %d (%s–%s) against interval %d (%s–%s), half-way through the steady part (after the warm-up); "+
		"dead tuples: the peak of the last %d intervals against the peak of the first %d after the warm-up (autovacuum %s, naptime %s: "+
		"dead tuples are a sawtooth of that period); limits: sizes ≤ %.1f× + %s, rows ≤ %.1f× + %d, dead tuples ≤ %.1f× + autovacuum's "+
		"trigger (threshold + scale factor × rows), p99 ≤ %.0f×, turns completed ≥ %.0f%% of those created in the interval, and none "+
		"timed out, failed or broke an invariant",
		v.Last, last.From, last.To, v.First, first.From, first.To, v.DeadWindow, v.DeadWindow, r.Autovacuum, r.AutovacuumNaptime,
		soakSizeFactor, bytesText(soakSizeSlack), soakSizeFactor, soakRowsSlack, soakSizeFactor, soakP99Factor, soakKeptUp*100), 110) {
		fmt.Fprintln(w, line)
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  check\tfirst\tlast\tlimit\tlast÷first\t\t")
	for _, c := range v.Checks {
		ratio := "-"
		if c.First > 0 {
			ratio = ratioText(c.Last / c.First)
		}
		mark := "ok"
		if !c.OK {
			mark = "NOT FLAT"
		}
		limit := "≤ " + soakFigure(c.Limit, c.Unit)
		if c.AtLeast {
			limit = "≥ " + soakFigure(c.Limit, c.Unit)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t\n", c.Name, soakFigure(c.First, c.Unit), soakFigure(c.Last, c.Unit), limit, ratio, mark)
	}
	_ = tw.Flush()
	if r.Flat {
		fmt.Fprintf(w, "verdict: FLAT\n")
	} else {
		fmt.Fprintf(w, "verdict: NOT FLAT\n")
	}
	fmt.Fprintf(w, "peak memory: harness process max RSS %s; total time: %s\n", bytesText(r.PeakRSSBytes), r.Elapsed.Round(100*time.Millisecond))
}

func soakFigure(v float64, unit string) string {
	switch unit {
	case "bytes":
		return bytesText(int64(v))
	case "ms":
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}
