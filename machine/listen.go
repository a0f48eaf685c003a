package machine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// listen keeps a pool connection LISTENing on channel until ctx ends,
// calling onNotify for each notification. After every (re)subscription it
// calls subscribed, so the caller can poll for what it missed while it was
// not listening. A lost connection is retried with backoff (10 ms, doubling,
// at most 5 s) and logged as who's.
func listen(ctx context.Context, pool *pgxpool.Pool, channel string, logger *slog.Logger, who string,
	subscribed func(), onNotify func(*pgconn.Notification)) {
	retry := 10 * time.Millisecond
	for ctx.Err() == nil {
		err := listenOnce(ctx, pool, pgx.Identifier{channel}.Sanitize(), subscribed, onNotify)
		if ctx.Err() != nil {
			return
		}
		logger.WarnContext(ctx, "arbor: "+who+" lost its LISTEN connection; retrying", slog.String("error", fmt.Sprint(err)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(2*retry, 5*time.Second)
	}
}

func listenOnce(ctx context.Context, pool *pgxpool.Pool, channel string, subscribed func(), onNotify func(*pgconn.Notification)) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A connection that LISTENed must not go back to the pool as it is:
	// close it, and the pool replaces it.
	defer func() {
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		return err
	}
	subscribed()
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		onNotify(n)
	}
}
