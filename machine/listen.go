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
// not listening. A lost connection is retried with backoff (see
// nextListenRetry) and logged as who's.
func listen(ctx context.Context, pool *pgxpool.Pool, channel string, logger *slog.Logger, who string,
	subscribed func(), onNotify func(*pgconn.Notification)) {
	var retry time.Duration
	for ctx.Err() == nil {
		listened, err := listenOnce(ctx, pool, pgx.Identifier{channel}.Sanitize(), subscribed, onNotify)
		if ctx.Err() != nil {
			return
		}
		retry = nextListenRetry(retry, listened)
		logger.WarnContext(ctx, "arbor: "+who+" lost its LISTEN connection; retrying", slog.String("error", fmt.Sprint(err)),
			slog.Duration("in", retry))
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// nextListenRetry is the wait before the next LISTEN attempt after one that
// failed, given the last wait and whether that attempt had subscribed: a
// connection that listened and was then lost (a failover, an idle timeout)
// is tried again at once and backs off from 10 ms anew; attempts that fail
// before subscribing double the wait, to at most 5 s.
func nextListenRetry(last time.Duration, listened bool) time.Duration {
	if listened || last == 0 {
		return 10 * time.Millisecond
	}
	return min(2*last, 5*time.Second)
}

// listenOnce LISTENs on one connection until it fails; listened says
// whether it got as far as subscribing.
func listenOnce(ctx context.Context, pool *pgxpool.Pool, channel string, subscribed func(), onNotify func(*pgconn.Notification)) (listened bool, err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	// A connection that LISTENed must not go back to the pool as it is:
	// close it, and the pool replaces it.
	defer func() {
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		return false, err
	}
	subscribed()
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		onNotify(n)
	}
}
