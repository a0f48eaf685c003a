package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/recovery"
	"github.com/arborhq/arbor/reconcile"
	"github.com/arborhq/arbor/tasks"
)

// Scenario (d): reconcile_on_open of a conversation with N running tasks.

// reconcileConv is the conversation scenario (d) recovers.
const reconcileConv = "recover-tree"

// runningTree builds a tree of N tasks in one conversation (bulk SQL through
// the guard trigger, fan-out 3, as scenario c's) and puts every one of them
// in running with a token and a live task lease, as a node that died while
// running them would have left them; the conversation itself has no holder.
// Setup only, not timed.
func runningTree(ctx context.Context, env *Env, size Size) (*tasks.Engine, time.Duration, error) {
	eng, err := tasks.New(ctx, env.Pool, &tasks.Config{Schema: env.Schema, Logger: env.Logger})
	if err != nil {
		return nil, 0, err
	}
	buildStart := time.Now()
	if _, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: reconcileConv, Kind: "L0"}); err != nil {
		return nil, 0, err
	}
	if err := buildTree(ctx, env, `INSERT INTO {schema}.tasks (conversation_id, owner_task_id, kind)
		SELECT conversation_id, id, $1 FROM {schema}.tasks, generate_series(1, $2)
		WHERE conversation_id = '`+reconcileConv+`' AND kind = $3 ORDER BY id LIMIT $4`, size.N); err != nil {
		return nil, 0, err
	}
	tag, err := env.Pool.Exec(ctx, env.sql(`UPDATE {schema}.tasks SET status = 'running', started_at = now(),
		token = nextval('{schema}.task_token_seq'), run_epoch = 0, lease_expires_at = now() + interval '1 hour'
		WHERE conversation_id = $1`), reconcileConv)
	if err != nil {
		return nil, 0, fmt.Errorf("start tree: %w", err)
	}
	if int(tag.RowsAffected()) != size.N {
		return nil, 0, fmt.Errorf("start tree: %d tasks running, want %d", tag.RowsAffected(), size.N)
	}
	if _, err := env.Pool.Exec(ctx, env.sql(`ANALYZE {schema}.tasks`)); err != nil {
		return nil, 0, err
	}
	return eng, time.Since(buildStart), nil
}

// reconcileArbor times the transaction a runner opens a conversation with
// (machine.Runner's open): the lease UPDATE and recovery.OnOpen, one
// commit. Every task must come back requeued: pending, attempt 1, no token.
func reconcileArbor(ctx context.Context, env *Env, size Size) (Measurement, error) {
	eng, built, err := runningTree(ctx, env, size)
	if err != nil {
		return Measurement{}, err
	}
	var rep reconcile.Report
	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	c := core.Of(eng)
	err = pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		holder, _, err := c.NewHolder(ctx, tx, "bench-node", time.Minute)
		if err != nil {
			return fmt.Errorf("take conversation: %w", err)
		}
		_, taken, err := c.TakeLease(ctx, tx, reconcileConv, "bench-node", holder)
		if err != nil {
			return fmt.Errorf("take conversation: %w", err)
		}
		_ = taken // the tasks are a dead node's: their recovery counts
		rep, err = recovery.OnOpen(ctx, c, tx, reconcileConv, true)
		return err
	})
	if err != nil {
		return Measurement{}, err
	}
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}
	if len(rep.Requeued) != size.N || len(rep.Abandoned)+len(rep.LimitExceeded)+len(rep.WaitsWoken)+len(rep.Completed) != 0 {
		return Measurement{}, fmt.Errorf("reconcile: requeued %d of %d, other outcomes %s", len(rep.Requeued), size.N, rep)
	}
	if err := expectRequeued(ctx, env, size.N); err != nil {
		return Measurement{}, err
	}
	m.Phases = map[string]time.Duration{"build (not timed)": built}
	return m, nil
}

// reconcileCeiling times the least the same recovery can cost: one plain
// UPDATE that puts the same running rows of arbor's table back to pending
// with attempt + 1 (the columns RequeueTx writes), through the same guard
// trigger and indexes, with no lease, no per-task read or lock, no check of
// abandon_on_restart or the restart limit, and no waits or completions to
// repair.
func reconcileCeiling(ctx context.Context, env *Env, size Size) (Measurement, error) {
	_, built, err := runningTree(ctx, env, size)
	if err != nil {
		return Measurement{}, err
	}
	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	tag, err := env.Pool.Exec(ctx, env.sql(`UPDATE {schema}.tasks
		SET status = 'pending', attempt = attempt + 1, token = NULL, run_epoch = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE conversation_id = $1 AND status = 'running'`), reconcileConv)
	if err != nil {
		return Measurement{}, err
	}
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}
	if int(tag.RowsAffected()) != size.N {
		return Measurement{}, fmt.Errorf("requeue updated %d rows, want %d", tag.RowsAffected(), size.N)
	}
	if err := expectRequeued(ctx, env, size.N); err != nil {
		return Measurement{}, err
	}
	m.Phases = map[string]time.Duration{"build (not timed)": built}
	return m, nil
}

// expectRequeued checks that all n tasks of the conversation are pending,
// on their second attempt (attempt 1), without a token.
func expectRequeued(ctx context.Context, env *Env, n int) error {
	return expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE conversation_id = '`+reconcileConv+`'
		AND status = 'pending' AND attempt = 1 AND token IS NULL`, n)
}
