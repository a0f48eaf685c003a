package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

// flatSetBased is a what-if, not arbor: a sketch, in SQL, of the design
// change issue 6's notes proposed for goal (a) — creating and completing
// tasks set-based, a batch per statement, the way River's completer does —
// run on arbor's own schema (its tasks table with every index, the guard
// trigger and the foreign keys) so that the proposal's gain is measured,
// not guessed. It keeps the engine's checks for what it does: conversation
// rows locked first and in order, a task settled only when it is running,
// held with its token, not abort-requested and without live foreground
// children, each settle numbered. It covers root tasks only (no owner to
// reconcile), which is all scenario (a) has; claims go through the real
// Engine.Claim. Its figure is labelled as a what-if in the table and is
// never arbor's figure.
func flatSetBased(ctx context.Context, env *Env, size Size) (Measurement, error) {
	eng, err := tasks.New(ctx, env.Pool, &tasks.Config{Schema: env.Schema})
	if err != nil {
		return Measurement{}, err
	}
	ensure := env.sql(`INSERT INTO {schema}.conversations (id) SELECT unnest($1::text[]) ON CONFLICT (id) DO NOTHING`)
	lockConvs := env.sql(`SELECT id FROM {schema}.conversations WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE`)
	insert := env.sql(`INSERT INTO {schema}.tasks (conversation_id, kind) SELECT unnest($1::text[]), 'noop'`)
	lockConvsOf := env.sql(`SELECT id FROM {schema}.conversations
		WHERE id IN (SELECT conversation_id FROM {schema}.tasks WHERE id = ANY($1))
		ORDER BY id FOR NO KEY UPDATE`)
	settle := env.sql(`WITH input AS (SELECT unnest($1::bigint[]) AS id, unnest($2::bigint[]) AS token),
		ok AS (
			SELECT t.id FROM {schema}.tasks t JOIN input i ON i.id = t.id AND t.token = i.token
			WHERE t.status = 'running' AND NOT t.abort_requested
			  AND NOT EXISTS (SELECT 1 FROM {schema}.tasks c WHERE c.owner_task_id = t.id AND NOT c.background
			                  AND c.status IN ('pending', 'running', 'waiting', 'sleeping', 'completing'))
			ORDER BY t.id FOR NO KEY UPDATE OF t)
		UPDATE {schema}.tasks t SET status = 'completed', settled_at = now(),
			settle_seq = nextval('{schema}.task_settle_seq'::regclass), token = NULL, run_epoch = NULL, lease_expires_at = NULL,
			updated_at = now()
		FROM ok WHERE t.id = ok.id AND t.owner_task_id IS NULL`)

	start := time.Now()
	batches := splitBatches(size.N, env.ClaimBatch)
	err = parallel(ctx, env.Conns, len(batches), func(ctx context.Context, b int) error {
		convs := make([]string, batches[b])
		for j := range convs {
			convs[j] = fmt.Sprintf("flat-%d", b*env.ClaimBatch+j)
		}
		return inTx(ctx, env.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, ensure, convs); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, lockConvs, convs); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, insert, convs)
			return err
		})
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("create: %w", err)
	}
	created := time.Now()

	var completed atomic.Int64
	done := make(chan struct{})
	err = engineLoop(ctx, eng, env.Conns, env.ClaimBatch, done, func(ctx context.Context, claimed []arbortype.Task) error {
		ids := make([]int64, len(claimed))
		tokens := make([]int64, len(claimed))
		for i, t := range claimed {
			// The no-op handler runs here, once per task.
			ids[i], tokens[i] = t.ID, t.Token
		}
		err := inTx(ctx, env.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, lockConvsOf, ids); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, settle, ids, tokens)
			if err != nil {
				return err
			}
			if int(tag.RowsAffected()) != len(ids) {
				return fmt.Errorf("settled %d of %d claimed tasks", tag.RowsAffected(), len(ids))
			}
			return nil
		})
		if err != nil {
			return err
		}
		if completed.Add(int64(len(claimed))) == int64(size.N) {
			close(done)
		}
		return nil
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("run: %w", err)
	}
	end := time.Now()
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.tasks WHERE status = 'completed'`, size.N); err != nil {
		return Measurement{}, err
	}
	return Measurement{
		Elapsed: end.Sub(start),
		Phases:  map[string]time.Duration{"create": created.Sub(start), "run": end.Sub(created)},
	}, nil
}
