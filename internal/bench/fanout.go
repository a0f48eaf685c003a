package bench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/tasks"
)

// Scenario (b): P parents, each fanning out to C children and waiting for
// all of them (all_settled).

// Phases of a fan-out parent, saved with its wait.
const phaseWaiting = "waiting"

// fanoutArborEngine is scenario (b) through the engine directly (runner
// pending issue 5). P parents are created, each a turn of a conversation
// of its own; then the engine loop runs three handlers:
//   - a parent that has not run: it creates its C children and waits on
//     them (all_settled) in one transaction, as a handler spawning a batch
//     of tool calls would (CreateTx and WaitForChildrenTx);
//   - a child: completes (the last one wakes its parent, in its own
//     transaction);
//   - a parent woken from its wait: completes.
//
// Time runs from the first parent's create to the last parent's complete.
func fanoutArborEngine(ctx context.Context, env *Env, size Size) (Measurement, error) {
	eng, err := tasks.New(ctx, env.Pool, &tasks.Config{Schema: env.Schema})
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	err = parallel(ctx, env.Conns, size.P, func(ctx context.Context, i int) error {
		_, _, err := eng.Create(ctx, tasks.CreateParams{ConversationID: fmt.Sprintf("fan-%d", i), Kind: "parent"})
		return err
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("create parents: %w", err)
	}

	var parentsDone atomic.Int64
	done := make(chan struct{})
	completeParent := func(ctx context.Context, t tasks.Task) error {
		if _, err := eng.Complete(ctx, t.ID, t.Token, nil); err != nil {
			return err
		}
		if parentsDone.Add(1) == int64(size.P) {
			close(done)
		}
		return nil
	}
	err = engineLoop(ctx, eng, env.Conns, env.ClaimBatch, done, func(ctx context.Context, t tasks.Task) error {
		switch {
		case t.Kind == "child":
			_, err := eng.Complete(ctx, t.ID, t.Token, nil)
			return err
		case t.Kind == "parent" && t.Phase == phaseWaiting:
			return completeParent(ctx, t)
		case t.Kind == "parent":
			satisfied, err := spawnAndWait(ctx, env, eng, t, size.C)
			if err != nil || !satisfied {
				return err
			}
			return completeParent(ctx, t)
		}
		return fmt.Errorf("task %d: unexpected kind %q, phase %q", t.ID, t.Kind, t.Phase)
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("run: %w", err)
	}
	end := time.Now()
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE status = 'completed'`, size.Tasks); err != nil {
		return Measurement{}, err
	}
	return Measurement{Elapsed: end.Sub(start)}, nil
}

// spawnAndWait creates c children of the running parent t and parks t on
// them, in one transaction. It reports whether the wait was already
// satisfied (then t is still running and must complete).
func spawnAndWait(ctx context.Context, env *Env, eng *tasks.Engine, t tasks.Task, c int) (bool, error) {
	var satisfied bool
	err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		ids := make([]int64, c)
		for i := range ids {
			child, _, err := eng.CreateTx(ctx, tx, tasks.CreateParams{
				ConversationID: t.ConversationID, OwnerID: t.ID, Kind: "child"})
			if err != nil {
				return err
			}
			ids[i] = child.ID
		}
		res, err := eng.WaitForChildrenTx(ctx, tx, t.ID, t.Token, tasks.WaitParams{
			ChildIDs: ids, Policy: tasks.AllSettled, Phase: phaseWaiting})
		satisfied = res.Satisfied
		return err
	})
	return satisfied, err
}

// fanoutDBOS runs the same tree in DBOS Transact Go, in the bench/dbos
// subprocess: P parent workflows, each starting C child workflows and
// waiting for their results. The subprocess measures the workload itself
// (after DBOS has launched and migrated its schema) and counts its
// statements and the server's counters the way the harness does.
func fanoutDBOS(ctx context.Context, env *Env, size Size) (Measurement, error) {
	if env.DBOS == nil {
		return Measurement{}, fmt.Errorf("DBOS is not available")
	}
	schema := strings.Replace(env.Schema, "arbor_bench", "dbos_bench", 1)
	defer func() {
		dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = env.Pool.Exec(dropCtx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	}()
	return env.DBOS.run(ctx, env.URL, schema, env.Conns, size)
}
