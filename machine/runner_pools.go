package machine

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/internal/core"
)

// runnerPools are a runner's own connections: work for the producer, the
// completer, maintenance, the wake service and the handlers' calls (the
// configured RunnerConfig.Pool, or one made from the engine pool's
// configuration); renew, one connection kept open for the lease's renewer
// alone; control for the watchdog's reads; announce, one connection kept
// open for the announcements sent after the runner's commits (a flush's
// log, a claim's runs, a handler's progress entry), so that a follower's
// news waits neither for a busy work pool nor for it to open a connection
// (internal/core/announce.go). The renewer waits behind nothing, not even
// the watchdog or an announcement.
type runnerPools struct {
	work, renew, control, announce *pgxpool.Pool
	ownWork                        bool
}

// newRunnerPools makes a runner's pools. Those it makes turn PostgreSQL's
// JIT off on each connection (noJIT), unless the engine reaches PostgreSQL through a transaction
// pooler, where a session's setting would outlive the session.
func newRunnerPools(ctx context.Context, c *core.Engine, cfg *RunnerConfig) (runnerPools, error) {
	var p runnerPools
	base := c.Pool.Config()
	if cfg.Pool != nil {
		p.work = cfg.Pool
		base = cfg.Pool.Config()
	}
	if !c.Cfg.TransactionPooler {
		base = noJIT(base)
	}
	if cfg.Pool == nil {
		wc := base.Copy()
		wc.MaxConns, wc.MinConns = int32(cfg.Flushers+1+WorkPoolExtraConns), 0 // + the completer's express lane
		pool, err := pgxpool.NewWithConfig(ctx, wc)
		if err != nil {
			return p, fmt.Errorf("the runner's pool: %w", err)
		}
		p.work, p.ownWork = pool, true
	}
	// One connection each, made from the same configuration: the renewer's
	// and the announcer's kept open, the watchdog's opened when it reads.
	for _, one := range []struct {
		pool     **pgxpool.Pool
		what     string
		minConns int32
	}{{&p.renew, "renewal connection", 1}, {&p.control, "control pool", 0}, {&p.announce, "announce connection", 1}} {
		oc := base.Copy()
		oc.MaxConns, oc.MinConns = 1, one.minConns
		pool, err := pgxpool.NewWithConfig(ctx, oc)
		if err != nil {
			p.close()
			return p, fmt.Errorf("the runner's %s: %w", one.what, err)
		}
		*one.pool = pool
	}
	return p, nil
}

func (p runnerPools) close() {
	if p.ownWork && p.work != nil {
		p.work.Close()
	}
	for _, pool := range []*pgxpool.Pool{p.renew, p.control, p.announce} {
		if pool != nil {
			pool.Close()
		}
	}
}

// noJIT returns a copy of cfg whose connections run SET jit = off once
// connected (after cfg's own AfterConnect). The runner's statements are
// short, and PostgreSQL compiles a plan with its JIT whenever the plan's
// estimate passes jit_above_cost: an open of 1,000 conversations over a
// backlog is estimated past it, and its compilation took 569 ms of a
// 694 ms open in bench (l) (30–40 ms with the estimate bounded).
func noJIT(cfg *pgxpool.Config) *pgxpool.Config {
	out := cfg.Copy()
	after := cfg.AfterConnect
	out.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if after != nil {
			if err := after(ctx, conn); err != nil {
				return err
			}
		}
		_, err := conn.Exec(ctx, "SET jit = off")
		return err
	}
	return out
}
