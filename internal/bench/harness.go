package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/migrations"
)

// Defaults of Options.
const (
	ConnsDefault          = 8
	ClaimBatchDefault     = 100
	RoundsDefault         = 5
	JSONPathDefault       = "bench-results.json"
	DBOSDirDefault        = "internal/bench/dbos"
	GoWorkflowsDirDefault = "internal/bench/goworkflows"
	RunTimeoutDefault     = 5 * time.Minute
	WakeSpreadDefault     = 2900 * time.Millisecond
)

// Options configure a run. The zero value of every field means its default.
type Options struct {
	// DatabaseURL is the database every subject runs in. Required.
	DatabaseURL string
	// Conns is the number of connections every in-process subject (arbor,
	// the ceiling, River) and each subprocess (DBOS, go-workflows) may
	// open, and the number of workers of the loops that claim work.
	// Default ConnsDefault (8).
	Conns int
	// ClaimBatch is how many tasks one claim takes, for arbor's engine loop
	// and the ceiling alike. Default ClaimBatchDefault (100).
	ClaimBatch int
	// Quick runs every scenario at its small sizes (seconds in all).
	Quick bool
	// Sizes overrides a scenario's sizes: key → size specs (see each
	// scenario's Sizes for the form).
	Sizes map[string][]string
	// Only limits the run to these scenario keys; empty runs all.
	Only []string
	// Rounds is how many rounds the subjects of a scenario run in at each
	// size: in each round every subject runs once, in an order that changes
	// from round to round, and each figure and ratio is reported as its
	// median over the rounds, each ratio with its range (computed per
	// round: both sides of a ratio from the same round). Default
	// RoundsDefault (5). A scenario or subject with MaxRounds runs in fewer.
	Rounds int
	// DBOSDir is the internal/bench/dbos module; "" or a missing directory
	// leaves DBOS out of the run, saying so in the table. Default
	// DBOSDirDefault when Options come from the command line.
	DBOSDir string
	// GoWorkflowsDir is the internal/bench/goworkflows module (go-workflows
	// in scenario (h)); "" or a missing directory leaves it out of the run,
	// saying so in the table. Default GoWorkflowsDirDefault when Options
	// come from the command line.
	GoWorkflowsDir string
	// Leave lists subjects to leave out of the run, as "scenario/subject"
	// (such as "e/river-only"); the table says they were left out.
	Leave []string
	// WakeSpread is the window scenario (e)'s sleeps are spread over (each
	// due 100 ms + U[0, WakeSpread) after it sleeps). Default
	// WakeSpreadDefault (2.9 s).
	WakeSpread time.Duration
	// RunnerPollInterval, when not 0, is the PollInterval of the
	// machine.Runner of scenarios (a) and (f). Default 0: the runner's own
	// default (1 s), as in production. The smoke test shortens it: a machine
	// that finds every worker slot taken waits for its poll.
	RunnerPollInterval time.Duration
	// WALByRelation: each measured run also reads the WAL it wrote with
	// pg_walinspect and reports its bytes and records per task by the
	// relation each record's block names and the record's type (the
	// table's and its indexes', a row's insert, update and lock apart),
	// printed after the scenario's tables and kept in the JSON. It reads
	// every record of the window: seconds for a large run.
	WALByRelation bool
	// ByStatement: each measured run also reads pg_stat_statements before
	// and after and reports, per task, the calls, time and WAL of each of
	// its statements (those naming the run's schema; with
	// pg_stat_statements.track = all, also those its triggers and
	// functions run), printed after the scenario's tables and kept in the
	// JSON. The server must load pg_stat_statements
	// (shared_preload_libraries) and the database have the extension.
	ByStatement bool
	// WhatIfSQL, when not empty, is run in each run's fresh schema after
	// its migrations ({schema} is the schema's quoted name): a what-if
	// schema (an index dropped, a fillfactor set) measured without a
	// migration. Never for published figures.
	WhatIfSQL string
	// RunTimeout bounds one subject's run at one size. Default 5 minutes.
	RunTimeout time.Duration
	// Out receives the tables. Default io.Discard.
	Out io.Writer
	// Logger receives progress. Default: discard.
	Logger *slog.Logger
}

func (o *Options) withDefaults() *Options {
	out := *o
	if out.Conns == 0 {
		out.Conns = ConnsDefault
	}
	if out.ClaimBatch == 0 {
		out.ClaimBatch = ClaimBatchDefault
	}
	if out.Rounds == 0 {
		out.Rounds = RoundsDefault
	}
	if out.WakeSpread == 0 {
		out.WakeSpread = WakeSpreadDefault
	}
	if out.RunTimeout == 0 {
		out.RunTimeout = RunTimeoutDefault
	}
	if out.Out == nil {
		out.Out = io.Discard
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return &out
}

func (o *Options) validate() error {
	if o.DatabaseURL == "" {
		return errors.New("Options.DatabaseURL: required")
	}
	if o.Conns < 1 || o.Conns > 100 {
		return fmt.Errorf("Options.Conns: %d is outside 1..100", o.Conns)
	}
	if o.ClaimBatch < 1 || o.ClaimBatch > 10_000 {
		return fmt.Errorf("Options.ClaimBatch: %d is outside 1..10000", o.ClaimBatch)
	}
	if o.WakeSpread < 0 {
		return fmt.Errorf("Options.WakeSpread: %s is negative", o.WakeSpread)
	}
	if o.Rounds < 1 {
		return fmt.Errorf("Options.Rounds: %d is below 1", o.Rounds)
	}
	known := map[string]bool{}
	for _, s := range Scenarios() {
		known[s.Key] = true
	}
	for _, k := range o.Only {
		if !known[k] {
			return fmt.Errorf("Options.Only: no scenario %q", k)
		}
	}
	for k := range o.Sizes {
		if !known[k] {
			return fmt.Errorf("Options.Sizes: no scenario %q", k)
		}
	}
	return nil
}

// Size is one size a scenario runs at.
type Size struct {
	// Spec is the size as written in --sizes, such as "1000" or "10x100".
	Spec string `json:"spec"`
	// Tasks is what the figures are divided by: the tasks (or jobs, or
	// workflows) one run handles.
	Tasks int `json:"tasks"`
	// N, P and C are the scenario's own dimensions (N tasks; P parents of
	// C children each).
	N int `json:"n,omitempty"`
	P int `json:"p,omitempty"`
	C int `json:"c,omitempty"`
}

// Measurement is what one run of a subject at one size measured.
type Measurement struct {
	// Elapsed is the time the scenario's operation took, from its first
	// statement to the moment the last task was seen settled.
	Elapsed time.Duration `json:"elapsed_ns"`
	// Tasks is the number of tasks handled; the figures divide by it.
	Tasks int `json:"tasks"`
	// Phases are parts of Elapsed, by name (such as "insert" and "run").
	Phases map[string]time.Duration `json:"phases_ns,omitempty"`
	// Latencies are per-event latencies, for the latency scenarios.
	Latencies []time.Duration `json:"-"`
	// Statements, Commits, XIDs and WALBytes count what the subject cost
	// the database while Elapsed ran (see Window): statements (round trips;
	// a batch or a COPY is one), commit records written to the WAL (each
	// one a WAL flush with synchronous_commit on; -1 when pg_walinspect is
	// not available), transaction ids assigned (transactions and
	// subtransactions that wrote) and WAL bytes.
	Statements int64 `json:"statements"`
	Commits    int64 `json:"commits"`
	XIDs       int64 `json:"xids"`
	WALBytes   int64 `json:"wal_bytes"`
	// ClientCPU is the CPU time the client process used (the harness, or
	// the DBOS subprocess); ServerCPU the PostgreSQL server's, all its
	// processes, -1 when the server is not on this machine.
	ClientCPU time.Duration `json:"client_cpu_ns"`
	ServerCPU time.Duration `json:"server_cpu_ns"`
	// counted is set when the RunFunc counted its own window (Window.End);
	// otherwise the harness counts the whole run.
	counted bool
	// Note says anything a reader must know about this figure.
	Note string `json:"note,omitempty"`
	// WAL is the WAL of the window by relation and record type, largest
	// first (Options.WALByRelation).
	WAL []WALShare `json:"wal_by_relation,omitempty"`
	// ByStatement is the window's statements by pg_stat_statements,
	// largest time first (Options.ByStatement).
	ByStatement []StatementShare `json:"by_statement,omitempty"`
}

// WALShare is the WAL that records of one type, naming one relation (or
// none: a commit, a sequence's log), wrote in a window.
type WALShare struct {
	Relation string `json:"relation"`
	Record   string `json:"record"`
	Bytes    int64  `json:"bytes"`
	Records  int64  `json:"records"`
	// FPIBytes are the full-page images among Bytes: the first change of
	// a page after a checkpoint logs the whole page, which is what a
	// table grown past the cache costs per row.
	FPIBytes int64 `json:"fpi_bytes"`
}

// RunFunc runs one subject of a scenario at one size in env's fresh schema.
type RunFunc func(ctx context.Context, env *Env, size Size) (Measurement, error)

// Subject is one implementation measured in a scenario: arbor (or a
// variant of arbor), or a baseline.
type Subject struct {
	// Key names the subject in the JSON results and the table ("arbor",
	// "ceiling", "river", "dbos").
	Key string
	// Arbor marks arbor's side; every other subject is a baseline, and the
	// ratios divide each arbor subject's figure by each baseline's — by
	// those named in Versus, when it is not nil.
	Arbor  bool
	Versus []string
	// Label heads its column in the table.
	Label string
	// MaxRounds, when above 0, caps Options.Rounds for this subject (it
	// runs in the first MaxRounds rounds only, and its ratios come from
	// those), and MaxTasks, when above 0, leaves it out of sizes of more
	// tasks (saying so): for a subject so slow that every round at every
	// size would take the run past its budget.
	MaxRounds, MaxTasks int
	// Timeout, when above Options.RunTimeout, bounds this subject's run
	// instead: for one whose untimed set-up (scenario (l)'s history) takes
	// minutes.
	Timeout time.Duration
	// Subprocess, when not "", names the module it runs in as a
	// subprocess ("dbos", "goworkflows"); when that module could not be
	// built, the table gives the reason instead of a figure.
	Subprocess string
	// Run measures it; nil when it cannot run (see Unavailable).
	Run RunFunc
	// Unavailable, when not empty, says why it cannot run; the table shows
	// it instead of a figure.
	Unavailable string
}

// Metric says what a scenario's figure is.
type Metric int

const (
	// Throughput scenarios report tasks per second (higher is better) and
	// microseconds per task.
	Throughput Metric = iota
	// Latency scenarios report the p50, p99 and max of
	// Measurement.Latencies.
	Latency
)

// Scenario is one benchmark: subjects compared at each of its sizes.
type Scenario struct {
	Key   string // "a", "b", …: the name --only and --sizes use
	Title string
	// About says what exactly runs, for the reader of the table.
	About  string
	Metric Metric
	// Goal states the target the issue sets, printed with the table.
	Goal string
	// Sizes are the default and the --quick sizes, as specs ParseSize reads.
	Sizes, QuickSizes []string
	// Unit names what a size's Tasks count, in the table's headings
	// (tasks/s, µs/task, per task). Default "task".
	Unit string
	// SizeForm documents the spec form, for --help and errors.
	SizeForm  string
	ParseSize func(spec string) (Size, error)
	// MaxRounds, when above 0, caps Options.Rounds for this scenario: a
	// latency scenario runs once per size, its percentiles already taken
	// over many events, and rounds would multiply the seconds each run
	// waits on timers.
	MaxRounds int
	// Subjects are measured in this order at each size.
	Subjects []Subject
	// Pending, when not empty, says why the scenario cannot run yet; the
	// harness prints it instead of a table.
	Pending string
}

// Env is what a RunFunc gets: the database, and a fresh schema of its own.
type Env struct {
	// Pool is the harness's pool, Conns connections at most, counted by
	// the statement counter. River's client and arbor's engine use it.
	Pool *pgxpool.Pool
	// URL is the database URL, for a subprocess.
	URL string
	// Schema is the run's fresh schema, migrated for arbor and River.
	Schema     string
	Conns      int
	ClaimBatch int
	WakeSpread time.Duration
	// RunnerPollInterval is Options.RunnerPollInterval.
	RunnerPollInterval time.Duration
	Logger             *slog.Logger
	// DBOS and GoWorkflows run the DBOS and the go-workflows
	// subprocesses; nil when not available.
	DBOS, GoWorkflows *Subprocess

	counter *counter
	// walinspect is the schema of the pg_walinspect extension, which
	// counts commits; "" when it is not available.
	walinspect string
	// walByRelation is Options.WALByRelation.
	walByRelation bool
	// byStatement is Options.ByStatement; pgss is the schema of
	// pg_stat_statements ("" when the database does not have it).
	byStatement bool
	pgss        string
	// postmaster is the server's pid when it runs on this machine, for
	// its CPU time; 0 otherwise.
	postmaster int
}

// newSchema creates and migrates a fresh schema (arbor's tables and
// River's) and returns a function that drops it.
func newSchema(ctx context.Context, pool *pgxpool.Pool) (string, func(), error) {
	return lendSchema(ctx, pool)
}

// lendSchema gives each run its schema: a fresh one, migrated and dropped
// after the run. The package's tests lend testdb's instead (main_test.go),
// emptied as a fresh one is, because the smoke test's eighty-odd runs
// spent more time migrating than running.
var lendSchema = func(ctx context.Context, pool *pgxpool.Pool) (string, func(), error) {
	return newSchemaNamed(ctx, pool, "arbor_bench")
}

// newSchemaNamed is newSchema with the schema's name starting with prefix.
func newSchemaNamed(ctx context.Context, pool *pgxpool.Pool, prefix string) (string, func(), error) {
	schema := randomName(prefix)
	m, err := migrations.New(pool, schema, nil)
	if err != nil {
		return "", nil, err
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	}
	if _, err := m.Up(ctx); err != nil {
		drop()
		return "", nil, fmt.Errorf("migrate %s: %w", schema, err)
	}
	return schema, drop, nil
}

// sizesFor returns the sizes scenario s runs at under o.
func (o *Options) sizesFor(s Scenario) ([]Size, error) {
	specs := s.Sizes
	if o.Quick {
		specs = s.QuickSizes
	}
	if override, ok := o.Sizes[s.Key]; ok {
		specs = override
	}
	out := make([]Size, 0, len(specs))
	for _, spec := range specs {
		size, err := s.ParseSize(strings.TrimSpace(spec))
		if err != nil {
			return nil, fmt.Errorf("scenario %s: size %q: %w (form: %s)", s.Key, spec, err, s.SizeForm)
		}
		out = append(out, size)
	}
	return out, nil
}

// Compared says whether the table and the results give the ratio of a's
// figure to b's: a is arbor's, b a baseline that a's Versus names (any
// baseline when Versus is nil).
func (a Subject) Compared(b Subject) bool {
	return a.Arbor && !b.Arbor && (a.Versus == nil || slices.Contains(a.Versus, b.Key))
}
