package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

// Scenario (a): N independent root tasks with a no-op handler.

// flatArborEngine is scenario (a) through the engine directly (the runner of
// issue 5 does not exist yet): N Creates on env.Conns goroutines, each root
// task a turn of a conversation of its own (docs/design.md §1: one live generation per
// conversation runs at a time, so independent turns are separate
// conversations); then the engine loop claims them in batches and completes
// each in a transaction of its own. A runner-based variant will be another
// RunFunc beside this one.
func flatArborEngine(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return flatArbor(ctx, env, size)
}

func flatArbor(ctx context.Context, env *Env, size Size) (Measurement, error) {
	eng, err := tasks.New(ctx, env.Pool, &tasks.Config{Schema: env.Schema})
	if err != nil {
		return Measurement{}, err
	}
	params := func(i int) arbortype.CreateParams {
		return arbortype.CreateParams{ConversationID: fmt.Sprintf("flat-%d", i), Kind: "noop"}
	}
	start := time.Now()
	err = parallel(ctx, env.Conns, size.N, func(ctx context.Context, i int) error {
		_, _, err := eng.Create(ctx, params(i))
		return err
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("create: %w", err)
	}
	created := time.Now()

	var completed atomic.Int64
	done := make(chan struct{})
	count := func(n int) {
		if completed.Add(int64(n)) == int64(size.N) {
			close(done)
		}
	}
	// The no-op handler: nothing to do but complete.
	handle := eachTask(func(ctx context.Context, t arbortype.Task) error {
		if _, err := completeTask(ctx, eng, nil, t); err != nil {
			return err
		}
		count(1)
		return nil
	})
	if err := engineLoop(ctx, eng, env.Conns, env.ClaimBatch, done, handle); err != nil {
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

// flatCeiling is the same row traffic with the simplest SQL there is: a
// minimal table, batched inserts, claims by UPDATE … SKIP LOCKED and one
// UPDATE … WHERE id = ANY(…) completing each claimed batch; no engine, no
// checks, no tree. Nothing on this database can do the work faster, so
// arbor's share of it says how much its guarantees cost.
func flatCeiling(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return flatCeilingWith(ctx, env, size, false)
}

// flatCeilingRow is the per-row ceiling: flatCeiling with every row inserted
// by a transaction of its own (one single-row INSERT, committed), on
// env.Conns goroutines — the plain-SQL bound of creating a turn per
// message — then claimed and completed in batches the same way.
func flatCeilingRow(ctx context.Context, env *Env, size Size) (Measurement, error) {
	return flatCeilingWith(ctx, env, size, true)
}

func flatCeilingWith(ctx context.Context, env *Env, size Size, perRow bool) (Measurement, error) {
	if _, err := env.Pool.Exec(ctx, env.sql(`CREATE TABLE {schema}.ceiling_tasks (
			id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			kind       text NOT NULL,
			status     text NOT NULL DEFAULT 'pending',
			created_at timestamptz NOT NULL DEFAULT now(),
			updated_at timestamptz NOT NULL DEFAULT now());
		CREATE INDEX ON {schema}.ceiling_tasks (id) WHERE status = 'pending'`)); err != nil {
		return Measurement{}, err
	}
	insert := env.sql(`INSERT INTO {schema}.ceiling_tasks (kind) SELECT unnest($1::text[])`)
	claim := env.sql(`UPDATE {schema}.ceiling_tasks SET status = 'running', updated_at = now()
		WHERE id IN (SELECT id FROM {schema}.ceiling_tasks WHERE status = 'pending'
		             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING id`)
	complete := env.sql(`UPDATE {schema}.ceiling_tasks SET status = 'completed', updated_at = now() WHERE id = ANY($1)`)

	start := time.Now()
	batches := splitBatches(size.N, insertBatch(size.N, env.Conns))
	if perRow {
		batches = splitBatches(size.N, 1)
	}
	err := parallel(ctx, env.Conns, len(batches), func(ctx context.Context, i int) error {
		kinds := make([]string, batches[i])
		for j := range kinds {
			kinds[j] = "noop"
		}
		_, err := env.Pool.Exec(ctx, insert, kinds)
		return err
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("insert: %w", err)
	}
	inserted := time.Now()

	// Every row is inserted before the workers start, so a claim that
	// comes back empty means the rest are in other workers' hands.
	err = parallel(ctx, env.Conns, env.Conns, func(ctx context.Context, _ int) error {
		for {
			rows, err := env.Pool.Query(ctx, claim, env.ClaimBatch)
			if err != nil {
				return err
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return err
			}
			if len(ids) == 0 {
				return nil
			}
			// The no-op handler runs here, once per id.
			if _, err := env.Pool.Exec(ctx, complete, ids); err != nil {
				return err
			}
		}
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("run: %w", err)
	}
	end := time.Now()
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.ceiling_tasks WHERE status = 'completed'`, size.N); err != nil {
		return Measurement{}, err
	}
	return Measurement{
		Elapsed: end.Sub(start),
		Phases:  map[string]time.Duration{"insert": inserted.Sub(start), "run": end.Sub(inserted)},
	}, nil
}

// River's settings for throughput, from its own benchmark command
// (riverbench): about 2,000 workers, a 2 ms fetch cooldown, a 20 ms fetch
// poll interval, and inserts of up to 5,000 jobs with InsertMany.
const (
	riverMaxWorkers        = 2000
	riverFetchCooldown     = 2 * time.Millisecond
	riverFetchPollInterval = 20 * time.Millisecond
	riverInsertBatchMax    = 5000
)

// noopArgs are the arguments of the River baseline's no-op job.
type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// flatRiver inserts N no-op jobs with InsertMany (batches on env.Conns
// goroutines, as the ceiling's), then starts a River client on the same
// pool and counts completions through a subscription, as River's own
// benchmark does, until all N are completed.
func flatRiver(ctx context.Context, env *Env, size Size) (Measurement, error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
	client, err := river.NewClient(riverpgxv5.New(env.Pool), &river.Config{
		Schema:            env.Schema,
		FetchCooldown:     riverFetchCooldown,
		FetchPollInterval: riverFetchPollInterval,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: riverMaxWorkers}},
		Workers:           workers,
		Logger:            env.Logger,
	})
	if err != nil {
		return Measurement{}, err
	}
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: size.N + 1000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer unsubscribe()

	start := time.Now()
	batches := splitBatches(size.N, insertBatch(size.N, env.Conns))
	err = parallel(ctx, env.Conns, len(batches), func(ctx context.Context, i int) error {
		params := make([]river.InsertManyParams, batches[i])
		for j := range params {
			params[j].Args = noopArgs{}
		}
		_, err := client.InsertMany(ctx, params)
		return err
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("insert: %w", err)
	}
	inserted := time.Now()
	if err := client.Start(ctx); err != nil {
		return Measurement{}, fmt.Errorf("start client: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()
	for n := 0; n < size.N; {
		select {
		case ev := <-events:
			if ev == nil {
				return Measurement{}, fmt.Errorf("subscription closed after %d of %d jobs", n, size.N)
			}
			if ev.Kind != river.EventKindJobCompleted {
				return Measurement{}, fmt.Errorf("job %d: %s", ev.Job.ID, ev.Kind)
			}
			n++
		case <-ctx.Done():
			return Measurement{}, fmt.Errorf("%w: %d of %d jobs completed: %w", errUnfinished, n, size.N, ctx.Err())
		}
	}
	end := time.Now()
	if err := expectCount(ctx, env, `SELECT count(*) FROM {schema}.river_job WHERE state = 'completed'`, size.N); err != nil {
		return Measurement{}, err
	}
	return Measurement{
		Elapsed: end.Sub(start),
		Phases:  map[string]time.Duration{"insert": inserted.Sub(start), "run": end.Sub(inserted)},
	}, nil
}

// insertBatch is the batch size of the baselines' bulk inserts: the N rows
// spread over the connections, at most River's recommended 5,000 a batch.
func insertBatch(n, conns int) int {
	return max(1, min(riverInsertBatchMax, (n+conns-1)/conns))
}

// splitBatches returns the sizes of the batches that cover n items.
func splitBatches(n, batch int) []int {
	var out []int
	for n > 0 {
		b := min(batch, n)
		out = append(out, b)
		n -= b
	}
	return out
}
