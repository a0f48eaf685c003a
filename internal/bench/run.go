package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/internal/cputime"
)

// Run runs the scenarios o selects and returns their results. It prints each
// scenario's table to o.Out as soon as the scenario ends. A subject that
// fails is reported in its table cell and in the report, and the run goes
// on; Run returns an error only when nothing could be measured at all (no
// database, bad options).
func Run(ctx context.Context, opts Options) (*Report, error) {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	// Every size is read before anything is connected or created: a typo
	// in --sizes costs nothing.
	sizes := map[string][]Size{}
	for _, s := range Scenarios() {
		if o.wants(s.Key) && s.Pending == "" {
			list, err := o.sizesFor(s)
			if err != nil {
				return nil, fmt.Errorf("bench: %w", err)
			}
			sizes[s.Key] = list
		}
	}
	started := time.Now()

	env, closeEnv, err := openEnv(ctx, o.DatabaseURL, o.Conns, o.Logger)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer closeEnv()
	env.ClaimBatch, env.WakeSpread, env.RunnerPollInterval = o.ClaimBatch, o.WakeSpread, o.RunnerPollInterval
	env.walByRelation = o.WALByRelation
	if o.ByStatement {
		env.byStatement = true
		if env.pgss = setupStatements(ctx, env.Pool); env.pgss == "" {
			fmt.Fprintf(o.Out, "note: pg_stat_statements is not available (shared_preload_libraries, CREATE EXTENSION), so statements are not listed\n\n")
		}
	}

	machine, err := readMachine(ctx, env.Pool)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	rep := &Report{
		Machine:   machine,
		StartedAt: started.UTC(),
		Options: ReportOptions{Conns: o.Conns, ClaimBatch: o.ClaimBatch, Quick: o.Quick,
			Rounds: o.Rounds},
	}
	printMachine(o.Out, rep)
	if env.walinspect == "" {
		fmt.Fprintf(o.Out, "note: pg_walinspect is not available, so commits are not counted (shown as ?)\n\n")
	}
	// why says, for each subprocess module a wanted subject runs in, why
	// it could not be built ("" when it was).
	why := map[string]string{}
	prepare := func(m module, dir string) *Subprocess {
		if !wantsSubprocess(o, m.key) {
			return nil
		}
		p, reason := buildSubprocess(ctx, m, dir, o.Logger)
		why[m.key] = reason
		return p
	}
	env.DBOS = prepare(dbosModule, o.DBOSDir)
	env.GoWorkflows = prepare(goWorkflowsModule, o.GoWorkflowsDir)
	for _, p := range []*Subprocess{env.DBOS, env.GoWorkflows} {
		if p != nil {
			defer p.Close()
		}
	}

	for _, s := range Scenarios() {
		if !o.wants(s.Key) {
			continue
		}
		res := ScenarioResult{Key: s.Key, Title: s.Title, About: s.About, Goal: s.Goal, Pending: s.Pending}
		for _, size := range sizes[s.Key] {
			res.Sizes = append(res.Sizes, runSize(ctx, o, env, s, size, why))
		}
		rep.Scenarios = append(rep.Scenarios, res)
		printScenario(o.Out, s, res)
	}
	rep.Elapsed = time.Since(started)
	rep.PeakRSSBytes = peakRSS()
	if env.DBOS != nil {
		rep.DBOSPeakRSSBytes = env.DBOS.peakRSS
	}
	if env.GoWorkflows != nil {
		rep.GoWorkflowsPeakRSSBytes = env.GoWorkflows.peakRSS
	}
	printFooter(o.Out, rep)
	return rep, nil
}

// openEnv connects the harness's pool (conns connections, counted by the
// statement counter) and finds what the counters read: the server's
// postmaster for its CPU time, pg_walinspect for the commits. The
// returned function undoes it (pg_walinspect dropped when openEnv created
// it, the pool closed). Run and Soak share it.
func openEnv(ctx context.Context, url string, conns int, logger *slog.Logger) (*Env, func(), error) {
	ctr := &counter{}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = int32(conns)
	cfg.ConnConfig.Tracer = ctr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	env := &Env{Pool: pool, URL: url, Conns: conns, Logger: logger, counter: ctr}
	env.postmaster = cputime.FindPostmaster(ctx, pool)
	var dropWalinspect func()
	env.walinspect, dropWalinspect = setupWalinspect(ctx, pool)
	return env, func() {
		dropWalinspect()
		pool.Close()
	}, nil
}

func (o *Options) wants(key string) bool {
	return len(o.Only) == 0 || slices.Contains(o.Only, key)
}

// runSize measures every subject of s at one size, in rounds, and computes
// the ratios of each arbor subject to each baseline. In each round every
// subject runs once, in the order roundOrder gives that round, so that a
// slow spell of the machine falls on the subjects of a round alike; each
// ratio is computed per round and reported as the median of those, with
// their range (see Spread). why gives, by module, the reason a subprocess
// subject cannot run.
func runSize(ctx context.Context, o *Options, env *Env, s Scenario, size Size, why map[string]string) SizeResult {
	out := SizeResult{Size: size, Rounds: o.Rounds}
	if s.MaxRounds > 0 {
		out.Rounds = min(out.Rounds, s.MaxRounds)
	}
	for _, sub := range s.Subjects {
		r := SubjectResult{Key: sub.Key, Label: sub.Label, Unavailable: sub.Unavailable}
		if sub.Subprocess != "" && why[sub.Subprocess] != "" && r.Unavailable == "" {
			r.Unavailable = why[sub.Subprocess]
		}
		if slices.Contains(o.Leave, s.Key+"/"+sub.Key) && r.Unavailable == "" {
			r.Unavailable = "left out of this run (Options.Leave)"
		}
		if sub.MaxTasks > 0 && size.Tasks > sub.MaxTasks && r.Unavailable == "" {
			r.Unavailable = fmt.Sprintf("left out above %d tasks (too slow for make bench's ten minutes; measure it with --sizes)", sub.MaxTasks)
		}
		if sub.Run == nil && r.Unavailable == "" {
			r.Unavailable = "no implementation"
		}
		out.Subjects = append(out.Subjects, r)
	}
	for round := range out.Rounds {
		position := 0
		for _, i := range roundOrder(len(s.Subjects), round) {
			sub, r := s.Subjects[i], &out.Subjects[i]
			if r.Unavailable != "" || r.Error != "" || (sub.MaxRounds > 0 && round >= sub.MaxRounds) {
				continue
			}
			position++
			o.Logger.InfoContext(ctx, "bench: running", slog.String("scenario", s.Key),
				slog.String("subject", sub.Key), slog.String("size", size.Spec), slog.Int("round", round+1))
			m, err := runOnce(ctx, o, env, sub, size)
			if err != nil {
				// A failed run voids the subject's figures at this size:
				// a median that skipped failures would flatter it.
				r.Error, r.Rounds = err.Error(), nil
				o.Logger.ErrorContext(ctx, "bench: run failed", slog.String("scenario", s.Key),
					slog.String("subject", sub.Key), slog.String("size", size.Spec), slog.String("error", err.Error()))
				continue
			}
			r.Rounds = append(r.Rounds, RoundResult{Round: round + 1, Position: position,
				Figures: figuresOf(s.Metric, &m), Measurement: &m})
		}
	}
	for i := range out.Subjects {
		out.Subjects[i].summarize(s.Metric)
	}
	for i, a := range s.Subjects {
		for j, b := range s.Subjects {
			if !a.Compared(b) {
				continue
			}
			ratios := ratioSpread
			if s.Metric == Latency {
				ratios = latencyRatioSpread
			}
			if ratio, ok := ratios(out.Subjects[i].Rounds, out.Subjects[j].Rounds); ok {
				if out.Subjects[i].Ratios == nil {
					out.Subjects[i].Ratios = map[string]Spread{}
				}
				out.Subjects[i].Ratios[b.Key] = ratio
			}
		}
	}
	return out
}

// runOnce runs fn in a fresh schema, counting what it cost the database.
func runOnce(ctx context.Context, o *Options, env *Env, sub Subject, size Size) (Measurement, error) {
	schema, drop, err := newSchema(ctx, env.Pool)
	if err != nil {
		return Measurement{}, err
	}
	defer drop()
	runEnv := *env
	runEnv.Schema = schema
	if o.WhatIfSQL != "" {
		if _, err := env.Pool.Exec(ctx, runEnv.sql(o.WhatIfSQL)); err != nil {
			return Measurement{}, fmt.Errorf("what-if SQL: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, max(o.RunTimeout, sub.Timeout))
	defer cancel()

	w, err := runEnv.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	m, err := sub.Run(ctx, &runEnv, size)
	if err != nil {
		return Measurement{}, err
	}
	if !m.counted {
		whole, err := w.End(ctx)
		if err != nil {
			return Measurement{}, err
		}
		m.Statements, m.Commits, m.XIDs, m.WALBytes = whole.Statements, whole.Commits, whole.XIDs, whole.WALBytes
		m.ClientCPU, m.ServerCPU = whole.ClientCPU, whole.ServerCPU
		m.WAL, m.ByStatement = whole.WAL, whole.ByStatement
	}
	if m.Tasks == 0 {
		m.Tasks = size.Tasks
	}
	return m, nil
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// errUnfinished is returned by a run whose work did not all finish in time.
var errUnfinished = errors.New("the work did not finish")

// wantsSubprocess says whether a scenario the run wants has a subject that
// runs in the subprocess module key (DBOS in (b) and (h), go-workflows in
// (h)): the module is built only then. (DBOS was once built for (b) alone,
// so that `-only h` ran without it.)
func wantsSubprocess(o *Options, key string) bool {
	for _, s := range Scenarios() {
		if !o.wants(s.Key) {
			continue
		}
		for _, sub := range s.Subjects {
			if sub.Subprocess == key {
				return true
			}
		}
	}
	return false
}
