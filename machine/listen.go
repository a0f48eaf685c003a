package machine

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/internal/notify"
)

// listen subscribes onNotify to channel on pool's one listener of the
// process (internal/notify: the runner, the waker and the engine's
// followers share its connection) until ctx ends. After every
// (re)subscription it calls subscribed, so the caller can poll for what it
// missed while nothing listened. A lost connection is retried by the
// listener, and logged with logger.
func listen(ctx context.Context, pool *pgxpool.Pool, channel string, logger *slog.Logger,
	subscribed func(), onNotify func(*pgconn.Notification)) {
	s := notify.Subscribe(pool, logger, []string{channel}, subscribed, onNotify)
	<-ctx.Done()
	s.Unsubscribe()
}
