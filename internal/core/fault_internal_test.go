package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestContextErrorsAreNotFaults: a context's end is the caller's, never a
// transient fault to retry — context.DeadlineExceeded is a net.Error, and
// passed for one — whatever wraps it; a connection the server did not
// answer within the connect's own timeout is a fault.
func TestContextErrorsAreNotFaults(t *testing.T) {
	t.Parallel()
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	for _, err := range []error{
		context.Canceled,
		context.DeadlineExceeded,
		fmt.Errorf("acquire: %w", context.DeadlineExceeded),
		fmt.Errorf("query: %w", context.Canceled),
		context.Cause(expired),
	} {
		require.False(t, transient(err), "%v is not transient", err)
	}
	for _, err := range []error{io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, pgconn.ErrConnClosed,
		&pgconn.PgError{Code: sqlStateAdminShutdown}, &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}} {
		require.True(t, transient(err), "%v is transient", err)
	}

	// A server that accepts and never answers: the connect's own timeout
	// ends it, with the caller's context live.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 1)
	go func() {
		defer close(accepted)
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		for c := range accepted {
			_ = c.Close()
		}
	})
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("postgres://u@%s/db?sslmode=disable", ln.Addr()))
	require.NoError(t, err)
	cfg.ConnectTimeout = 10 * time.Millisecond
	_, err = pgconn.ConnectConfig(context.Background(), cfg)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, transient(err), "a connect timeout is a fault: %v", err)
}
