package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
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
	return fanoutArbor(ctx, env, size)
}

func fanoutArbor(ctx context.Context, env *Env, size Size) (Measurement, error) {
	eng, err := tasks.New(ctx, env.Pool, &tasks.Config{Schema: env.Schema})
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	err = parallel(ctx, env.Conns, size.P, func(ctx context.Context, i int) error {
		_, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("fan-%d", i), Kind: "parent"})
		return err
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("create parents: %w", err)
	}

	var parentsDone atomic.Int64
	done := make(chan struct{})
	parentDone := func() {
		if parentsDone.Add(1) == int64(size.P) {
			close(done)
		}
	}
	// complete completes a child or a woken parent, in tx when not nil.
	complete := func(ctx context.Context, tx pgx.Tx, t arbortype.Task) error {
		_, err := completeTask(ctx, eng, tx, t)
		return err
	}
	handle := func(ctx context.Context, claimed []arbortype.Task) error {
		var rest []arbortype.Task
		for _, t := range claimed {
			switch {
			case t.Kind == "parent" && t.Phase == "":
				// A wait found satisfied wakes the parent at once: the loop
				// claims it again, in its waiting phase, and completes it.
				if err := spawnAndWait(ctx, env, eng, t, size.C); err != nil {
					return err
				}
			case t.Kind == "parent" && t.Phase == phaseWaiting, t.Kind == "child":
				rest = append(rest, t)
			default:
				return fmt.Errorf("task %d: unexpected kind %q, phase %q", t.ID, t.Kind, t.Phase)
			}
		}
		err := eachTask(func(ctx context.Context, t arbortype.Task) error { return complete(ctx, nil, t) })(ctx, rest)
		if err != nil {
			return err
		}
		for _, t := range rest {
			if t.Kind == "parent" {
				parentDone()
			}
		}
		return nil
	}
	if err := engineLoop(ctx, eng, env.Conns, env.ClaimBatch, done, handle); err != nil {
		return Measurement{}, fmt.Errorf("run: %w", err)
	}
	end := time.Now()
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE status = 'completed'`, size.Tasks); err != nil {
		return Measurement{}, err
	}
	return Measurement{Elapsed: end.Sub(start)}, nil
}

// spawnAndWait creates c children of the running parent t and parks t on
// them, in one transaction.
func spawnAndWait(ctx context.Context, env *Env, eng *tasks.Engine, t arbortype.Task, c int) error {
	ce := core.Of(eng)
	return pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		ids := make([]int64, c)
		for i := range ids {
			child, _, err := eng.CreateTx(ctx, tx, arbortype.CreateParams{
				ConversationID: t.ConversationID, OwnerID: t.ID, Kind: "child"})
			if err != nil {
				return err
			}
			ids[i] = child.ID
		}
		_, err := ce.WaitForChildren(ctx, tx, t.ID, t.Token, core.WaitParams{
			ChildIDs: ids, Policy: arbortype.AllSettled, Phase: phaseWaiting})
		return err
	})
}

// fanoutDBOS runs the same tree in DBOS Transact Go, in the
// internal/bench/dbos subprocess: P parent workflows, each starting C child
// workflows and waiting for their results. The subprocess measures the
// workload itself (after DBOS has launched and migrated its schema) and counts
// its statements and the server's counters the way the harness does.
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
	return env.DBOS.run(ctx, env, size, "", "-schema", schema,
		"-parents", strconv.Itoa(size.P), "-children", strconv.Itoa(size.C))
}
