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
	return machinePoolWith(ctx, env, tasks.Config{})
}

// machinePoolWith is machinePool with an engine configured by cfg (its
// Schema, and its Logger when nil, are the run's).
func machinePoolWith(ctx context.Context, env *Env, cfg tasks.Config) (*pgxpool.Pool, *tasks.Engine, error) {
	pcfg, err := pgxpool.ParseConfig(env.URL)
	if err != nil {
		return nil, nil, err
	}
	pcfg.MaxConns = int32(env.Conns + listenConns)
	pcfg.ConnConfig.Tracer = env.counter
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	cfg.Schema = env.Schema
	if cfg.Logger == nil {
		cfg.Logger = env.Logger
	}
	eng, err := tasks.New(ctx, pool, &cfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, eng, nil
}
