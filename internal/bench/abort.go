package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

// Scenario (c): abort of a subtree of N tasks.

// treeFanout is the fan-out of the benchmark trees: every node has this
// many children, down to the level that reaches N tasks.
const treeFanout = 3

// abortArbor builds a tree of N tasks under one running root and times
// Engine.Abort of that root: one transaction that marks every task
// abort-requested and settles them leaves first.
func abortArbor(ctx context.Context, env *Env, size Size) (Measurement, error) {
	eng, err := tasks.New(ctx, env.Pool, &tasks.Config{Schema: env.Schema})
	if err != nil {
		return Measurement{}, err
	}
	const conv = "abort-tree"
	root, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "L0"})
	if err != nil {
		return Measurement{}, err
	}
	buildStart := time.Now()
	if err := buildTree(ctx, env, `INSERT INTO {schema}.tasks (conversation_id, owner_task_id, kind)
		SELECT conversation_id, id, $1 FROM {schema}.tasks, generate_series(1, $2)
		WHERE conversation_id = '`+conv+`' AND kind = $3 ORDER BY id LIMIT $4`, size.N); err != nil {
		return Measurement{}, err
	}
	// Every third task has run (aborted rather than orphaned), the root too.
	if _, err := env.Pool.Exec(ctx, env.sql(`UPDATE {schema}.tasks SET status = 'running', started_at = now(),
		token = nextval('{schema}.task_token_seq'), run_epoch = 0, lease_expires_at = now() + interval '1 hour'
		WHERE conversation_id = $1 AND (id % 3 = 0 OR id = $2)`), conv, root.ID); err != nil {
		return Measurement{}, fmt.Errorf("start tree: %w", err)
	}
	if _, err := env.Pool.Exec(ctx, env.sql(`ANALYZE {schema}.tasks`)); err != nil {
		return Measurement{}, err
	}
	built := time.Since(buildStart)

	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	rep, err := eng.Abort(ctx, root.ID)
	if err != nil {
		return Measurement{}, err
	}
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}
	if len(rep.Settled) != size.N {
		return Measurement{}, fmt.Errorf("abort settled %d tasks, want %d", len(rep.Settled), size.N)
	}
	m.Phases = map[string]time.Duration{"build (not timed)": built}
	return m, nil
}

// abortCeiling builds the same tree in a minimal table and times one
// recursive UPDATE that marks it aborted: the least any abort of N rows can
// cost on this database (no order, no locks beyond the rows', no checks).
func abortCeiling(ctx context.Context, env *Env, size Size) (Measurement, error) {
	if _, err := env.Pool.Exec(ctx, env.sql(`CREATE TABLE {schema}.ceiling_tree (
			id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			owner_id bigint REFERENCES {schema}.ceiling_tree (id),
			kind     text NOT NULL,
			status   text NOT NULL DEFAULT 'pending');
		CREATE INDEX ON {schema}.ceiling_tree (owner_id);
		INSERT INTO {schema}.ceiling_tree (kind) VALUES ('L0')`)); err != nil {
		return Measurement{}, err
	}
	buildStart := time.Now()
	if err := buildTree(ctx, env, `INSERT INTO {schema}.ceiling_tree (owner_id, kind)
		SELECT id, $1 FROM {schema}.ceiling_tree, generate_series(1, $2)
		WHERE kind = $3 ORDER BY id LIMIT $4`, size.N); err != nil {
		return Measurement{}, err
	}
	if _, err := env.Pool.Exec(ctx, env.sql(`UPDATE {schema}.ceiling_tree SET status = 'running' WHERE id % 3 = 0 OR id = 1;
		ANALYZE {schema}.ceiling_tree`)); err != nil {
		return Measurement{}, err
	}
	built := time.Since(buildStart)

	w, err := env.StartWindow(ctx)
	if err != nil {
		return Measurement{}, err
	}
	tag, err := env.Pool.Exec(ctx, env.sql(`WITH RECURSIVE sub AS (
			SELECT id FROM {schema}.ceiling_tree WHERE id = 1
			UNION ALL
			SELECT c.id FROM {schema}.ceiling_tree c JOIN sub ON c.owner_id = sub.id)
		UPDATE {schema}.ceiling_tree t SET status = 'aborted'
		FROM sub WHERE t.id = sub.id AND t.status IN ('pending', 'running')`))
	if err != nil {
		return Measurement{}, err
	}
	m, err := w.End(ctx)
	if err != nil {
		return Measurement{}, err
	}
	if int(tag.RowsAffected()) != size.N {
		return Measurement{}, fmt.Errorf("abort updated %d rows, want %d", tag.RowsAffected(), size.N)
	}
	m.Phases = map[string]time.Duration{"build (not timed)": built}
	return m, nil
}

// buildTree grows a tree whose root (kind L0) exists to n nodes with bulk
// SQL, level by level: each node of level d gets treeFanout children of
// kind L(d+1), the last level only as many as n leaves room for. insert
// takes the child kind ($1), the fan-out ($2), the parent kind ($3) and the
// row limit ($4). Setup only: arbor's rows go through its guard trigger as
// pending inserts, as in internal/core/bigtree_test.go.
func buildTree(ctx context.Context, env *Env, insert string, n int) error {
	insert = env.sql(insert)
	total := 1
	for depth := 0; total < n; depth++ {
		tag, err := env.Pool.Exec(ctx, insert, fmt.Sprintf("L%d", depth+1), treeFanout, fmt.Sprintf("L%d", depth), n-total)
		if err != nil {
			return fmt.Errorf("build tree level %d: %w", depth+1, err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("build tree level %d: no rows", depth+1)
		}
		total += int(tag.RowsAffected())
	}
	return nil
}

// sql renders {schema} as the run's quoted schema.
func (e *Env) sql(q string) string {
	return strings.ReplaceAll(q, "{schema}", pgx.Identifier{e.Schema}.Sanitize())
}

// expectCount checks that a count query over the run's schema says want:
// a run that did not do all its work must not report a figure.
func expectCount(ctx context.Context, env *Env, q string, want int) error {
	var got int
	if err := env.Pool.QueryRow(ctx, env.sql(q)).Scan(&got); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if got != want {
		return fmt.Errorf("verify: %d done, want %d", got, want)
	}
	return nil
}
