package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// agedTasks is the timed run of scenario (l): (a)'s runner at this many
// tasks, on a fresh schema and on one that keeps a settled history.
const agedTasks = 8000

// parseAged reads scenario (l)'s size: N settled tasks kept before the
// timed run, which always handles agedTasks (fewer for a smaller N, in a
// quick run).
func parseAged(spec string) (Size, error) {
	n, err := strconv.Atoi(spec)
	if err != nil || n < 1 || n > 10_000_000 {
		return Size{}, fmt.Errorf("want a whole number from 1 to 10000000")
	}
	return Size{Spec: spec, Tasks: min(agedTasks, max(n, 100)), N: n}, nil
}

// flatFresh is scenario (l)'s reference: (a)'s runner (CreateMany in
// batches, one conversation per task) at size.Tasks tasks on a fresh
// schema.
func flatFresh(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return flatRunnerIn(ctx, env, Size{Spec: size.Spec, Tasks: size.Tasks, N: size.Tasks}, true)
}

// flatAged is flatFresh after size.N tasks were created, run and settled
// in the same schema by a runner of their own (not timed), with retention
// off (the engine's default), so the tables, their indexes and the log
// hold them all, then vacuumed and analyzed as autovacuum would have by
// the time such a history had accumulated: the timed run measures what a
// task costs on tables that have grown, not on dead tuples of the fill.
func flatAged(ctx context.Context, env *Env, size Size) (Measurement, error) {
	began := time.Now()
	if err := fillSettled(ctx, env, size.N); err != nil {
		return Measurement{}, fmt.Errorf("fill: %w", err)
	}
	filled := time.Now()
	vacuumStart := filled
	for _, t := range []string{"tasks", "conversations", "conversation_log", "holders", "river_job"} {
		if _, err := env.Pool.Exec(ctx, env.sql(`VACUUM (ANALYZE) {schema}.`+pgx.Identifier{t}.Sanitize())); err != nil {
			return Measurement{}, fmt.Errorf("vacuum %s: %w", t, err)
		}
	}
	vacuumed := time.Since(vacuumStart)
	var bytes int64
	if err := env.Pool.QueryRow(ctx, `SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'`, env.Schema).Scan(&bytes); err != nil {
		return Measurement{}, err
	}
	m, err := flatFresh(ctx, env, size)
	if err != nil {
		return Measurement{}, err
	}
	m.Note = fmt.Sprintf("before the timed run: %d tasks created, run and settled in %s, vacuumed in %s; the schema's tables then held %d MiB",
		size.N, filled.Sub(began).Round(time.Second), vacuumed.Round(time.Second), bytes>>20)
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE status = 'completed'`, size.N+size.Tasks); err != nil {
		return Measurement{}, err
	}
	return m, nil
}

// fillSettled creates n one-task conversations (hist-…) with CreateMany
// while a runner of its own runs them to completion, and waits for the
// last; the runner is stopped before it returns.
func fillSettled(ctx context.Context, env *Env, n int) error {
	nr, err := startNoopRunner(ctx, env, n)
	if err != nil {
		return err
	}
	defer nr.stop()
	if err := createNoops(ctx, env, nr.eng, "hist", n, 5000); err != nil {
		return err
	}
	select {
	case <-nr.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %d of %d tasks completed: %w", errUnfinished, nr.completed.Load(), n, ctx.Err())
	}
}
