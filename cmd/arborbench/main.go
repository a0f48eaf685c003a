// Command arborbench runs arbor's side-by-side benchmarks (issue 6): each
// scenario at its sizes, against the plain-SQL ceiling, River, DBOS
// Transact Go and (in scenario h) go-workflows, measured in the same run on
// the same PostgreSQL, the subjects interleaved in rounds (--reps, default
// 5). It prints a table per scenario, each ratio as the median of its
// per-round ratios with their range and the CPU per task beside it, and the
// peak memory, and writes the results as JSON, every round's figures
// included.
// With --soak it runs the soak instead (issue 14): a Runner under a steady
// load for minutes while prune runs, the tables sampled every interval, and
// a verdict on whether they stayed flat (exit status 1 when not).
//
//	make bench                      # a throwaway PostgreSQL, fsync on
//	ARBOR_DATABASE_URL=… go run ./cmd/arborbench --quick
//	make soak                       # --soak: minutes of steady load with prune; exits 1 when not flat
//
// Run it from the repository's root, where internal/bench/dbos (the DBOS
// module) and internal/bench/goworkflows (go-workflows') are found, or say
// where they are with --dbos-dir and --goworkflows-dir.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/arborhq/arbor/internal/bench"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "arborbench:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("arborbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		url     = fs.String("database-url", os.Getenv("ARBOR_DATABASE_URL"), "PostgreSQL URL (default $ARBOR_DATABASE_URL)")
		quick   = fs.Bool("quick", false, "run every scenario at its small sizes (a smoke run of about half a minute)")
		sizes   = fs.String("sizes", "", "override sizes per scenario, e.g. 'a=1000,5000,20000;b=10x10,20x50,20x200;c=500,1000,2000'")
		only    = fs.String("only", "", "run only these scenarios, e.g. 'a,c' (default all)")
		conns   = fs.Int("conns", bench.ConnsDefault, "connections for every subject, and workers of the claim loops")
		batch   = fs.Int("claim-batch", bench.ClaimBatchDefault, "tasks per claim, for arbor's engine loop and the ceiling")
		out     = fs.String("json", bench.JSONPathDefault, "write the results here as JSON ('' for none)")
		dbosDir = fs.String("dbos-dir", bench.DBOSDirDefault, "the internal/bench/dbos module ('' leaves DBOS out)")
		gowfDir = fs.String("goworkflows-dir", bench.GoWorkflowsDirDefault, "the internal/bench/goworkflows module ('' leaves go-workflows out)")
		verbose = fs.Bool("v", false, "log progress to stderr")
		cpuProf = fs.String("cpuprofile", "", "write a CPU profile of the harness process (all subjects in it) to this file")
		timeout = fs.Duration("run-timeout", bench.RunTimeoutDefault, "bound of one subject's run at one size")
		poll    = fs.Duration("runner-poll", 0, "PollInterval of the machine.Runners of (a) and (f), for diagnosis (default: the runner's own, 1s)")
		leave   = fs.String("leave", "", "leave these subjects out, as scenario/subject, e.g. 'e/river-only,a/arbor-batch'")
		walRel  = fs.Bool("wal-by-relation", false, "also list each run's WAL per task by relation and record type (pg_walinspect; slow for large runs)")
		byStmt  = fs.Bool("by-statement", false, "also list each run's statements per task: calls, time, WAL (pg_stat_statements, which the server must preload; with pg_stat_statements.track = all, also the statements triggers run)")
		whatIf  = fs.String("whatif-sql", "", "a file of SQL run in each run's fresh schema after its migrations ({schema}: its quoted name), to measure a what-if schema; never for published figures")

		soak           = fs.Bool("soak", false, "run the soak instead of the scenarios: a Runner for minutes under a steady load while prune runs; exits non-zero when it is not flat (see docs/performance.md)")
		soakDuration   = fs.Duration("soak-duration", bench.SoakDurationDefault, "soak: how long the producer runs")
		soakInterval   = fs.Duration("soak-interval", bench.SoakIntervalDefault, "soak: how often the tables and latencies are sampled")
		soakWarmup     = fs.Duration("soak-warmup", 0, "soak: time before the first interval the verdict compares with the last (default: retention or IdleRelease, the longer, + think times + 2 prune intervals, in whole intervals)")
		soakRate       = fs.Float64("soak-rate", bench.SoakRateDefault, "soak: turns created per second")
		soakRetention  = fs.Duration("soak-retention", bench.SoakRetentionDefault, "soak: tasks.Config.Retention of the runner's periodic prune job (at least 1m)")
		soakPruneEvery = fs.Duration("soak-prune-interval", bench.SoakPruneIntervalDefault, "soak: tasks.Config.PruneInterval (or the pause of --soak-prune-older-than's loop)")
		soakOlderThan  = fs.Duration("soak-prune-older-than", 0, "soak: prune with the harness's own loop of Engine.Prune(OlderThan) instead of the periodic job (default: the job)")
		soakThink      = fs.Duration("soak-think-time", bench.SoakThinkTimeDefault, "soak: the longest a conversation waits between a turn and its next")
	)
	var rounds int
	roundsUsage := "rounds at each size: in each every subject runs once, in an order that changes from round to round; " +
		"figures are the medians over the rounds, ratios the median of the per-round ratios with their range"
	fs.IntVar(&rounds, "reps", bench.RoundsDefault, roundsUsage)
	fs.IntVar(&rounds, "rounds", bench.RoundsDefault, "the same as --reps")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: arborbench [flags]\n\nScenarios:\n")
		for _, s := range bench.Scenarios() {
			fmt.Fprintf(stderr, "  %s  %s\n", s.Key, s.Title)
			fmt.Fprintf(stderr, "     sizes %s (quick %s); form: %s\n", strings.Join(s.Sizes, ","), strings.Join(s.QuickSizes, ","), s.SizeForm)
			if s.Pending != "" {
				fmt.Fprintf(stderr, "     not runnable yet: %s\n", s.Pending)
			}
		}
		fmt.Fprintf(stderr, "\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	if *url == "" {
		return errors.New("no database: set ARBOR_DATABASE_URL or --database-url, or run `make bench` (`make soak`), which starts a throwaway PostgreSQL")
	}
	jsonSet := false
	fs.Visit(func(f *flag.Flag) { jsonSet = jsonSet || f.Name == "json" })
	var logger *slog.Logger
	if *verbose {
		logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *soak {
		path := bench.SoakJSONPathDefault
		if jsonSet {
			path = *out
		}
		return runSoak(ctx, bench.SoakOptions{
			DatabaseURL: *url, Duration: *soakDuration, Interval: *soakInterval, Warmup: *soakWarmup, Rate: *soakRate,
			Retention: *soakRetention, PruneInterval: *soakPruneEvery, PruneOlderThan: *soakOlderThan, ThinkTime: *soakThink,
			Conns: *conns, Out: stdout, Logger: logger,
		}, path, stdout)
	}
	opts := bench.Options{
		DatabaseURL: *url, Quick: *quick, Conns: *conns, ClaimBatch: *batch, Rounds: rounds,
		DBOSDir: *dbosDir, GoWorkflowsDir: *gowfDir, Out: stdout, RunTimeout: *timeout,
		RunnerPollInterval: *poll, WALByRelation: *walRel, ByStatement: *byStmt,
	}
	if *whatIf != "" {
		b, err := os.ReadFile(*whatIf)
		if err != nil {
			return fmt.Errorf("--whatif-sql: %w", err)
		}
		opts.WhatIfSQL = string(b)
	}
	if *leave != "" {
		opts.Leave = strings.Split(*leave, ",")
	}
	opts.Logger = logger
	if *only != "" {
		opts.Only = strings.Split(*only, ",")
	}
	if *sizes != "" {
		opts.Sizes = map[string][]string{}
		for _, part := range strings.Split(*sizes, ";") {
			key, list, ok := strings.Cut(part, "=")
			if !ok || list == "" {
				return fmt.Errorf("--sizes: %q is not KEY=SIZE,SIZE,…", part)
			}
			opts.Sizes[strings.TrimSpace(key)] = strings.Split(list, ",")
		}
	}
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := bench.Run(ctx, opts)
	if err != nil {
		return err
	}
	if *out != "" {
		if err := rep.WriteJSON(*out); err != nil {
			return fmt.Errorf("write %s: %w", *out, err)
		}
		fmt.Fprintf(stdout, "results written to %s\n", *out)
	}
	return nil
}

// errNotFlat is the error of a soak that ran and is not flat: the verdict
// printed above it says why.
var errNotFlat = errors.New("soak: not flat (see the verdict above)")

func runSoak(ctx context.Context, opts bench.SoakOptions, path string, stdout io.Writer) error {
	rep, err := bench.Soak(ctx, opts)
	if err != nil {
		return err
	}
	if path != "" {
		if err := rep.WriteJSON(path); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		fmt.Fprintf(stdout, "results written to %s\n", path)
	}
	if !rep.Flat {
		return errNotFlat
	}
	return nil
}
