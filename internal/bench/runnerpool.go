package bench

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/tasks"
)

// listenConns is how many connections the runner-based subjects add to
// env.Conns: a machine.Runner holds one connection for its LISTEN, its
// machine.Waker another, and the Waker's River client one for its notifier
// and one for its producer/leader work. They sit idle; the work itself
// runs on env.Conns workers.
const listenConns = 4

// machinePool opens a pool of env.Conns + listenConns connections on the
// run's database for a runner or a waker, counted by the same statement
// counter as env.Pool, and an engine on the run's schema over it. The
// caller closes the pool.
func machinePool(ctx context.Context, env *Env) (*pgxpool.Pool, *tasks.Engine, error) {
	cfg, err := pgxpool.ParseConfig(env.URL)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = int32(env.Conns + listenConns)
	cfg.ConnConfig.Tracer = env.counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	eng, err := tasks.New(ctx, pool, &tasks.Config{Schema: env.Schema, Logger: env.Logger})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, eng, nil
}
