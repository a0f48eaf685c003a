package core

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
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
	// ends it, with the caller's context live. On a starved machine the
	// dial itself may be what times out (a net timeout, not the context's):
	// that is a fault too, and the connect is tried again until the
	// context's case is seen.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-accepted
		for _, c := range held {
			_ = c.Close()
		}
	})
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("postgres://u@%s/db?sslmode=disable", ln.Addr()))
	require.NoError(t, err)
	cfg.ConnectTimeout = 50 * time.Millisecond
	sawDeadline := false
	for range 50 {
		_, err = pgconn.ConnectConfig(context.Background(), cfg)
		require.Error(t, err)
		require.True(t, transient(err), "a connect timeout is a fault: %v", err)
		if errors.Is(err, context.DeadlineExceeded) {
			sawDeadline = true
			break
		}
	}
	require.True(t, sawDeadline, "a connect that timed out waiting for the server's answer: %v", err)
}

// TestEverySentinelIsListed fails when an Err… of arbortype is not in
// sentinels: classify would wrap that refusal in ErrDatabase ("database
// error: …"), and a caller testing errors.Is(err, ErrDatabase) would take
// bad input for a broken database.
func TestEverySentinelIsListed(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	defined := map[string]bool{}
	files, err := filepath.Glob("../../arbortype/*.go")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, spec := range g.Specs {
					for _, n := range spec.(*ast.ValueSpec).Names {
						if strings.HasPrefix(n.Name, "Err") {
							defined[n.Name] = true
						}
					}
				}
			}
		}
	}
	require.Contains(t, defined, "ErrNotFound", "the parse found arbortype's sentinels")

	f, err := parser.ParseFile(fset, "fault.go", nil, 0)
	require.NoError(t, err)
	listed := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "sentinels" {
			return true
		}
		for _, el := range vs.Values[0].(*ast.CompositeLit).Elts {
			if sel, ok := el.(*ast.SelectorExpr); ok && sel.X.(*ast.Ident).Name == "arbortype" {
				listed[sel.Sel.Name] = true
			}
		}
		return false
	})
	for name := range defined {
		require.True(t, listed[name], "arbortype.%s is not in sentinels (internal/core/fault.go): classify would call it a database error", name)
	}
	for _, s := range sentinels {
		err := fmt.Errorf("op: %w", s)
		require.Same(t, err, classify(context.Background(), err), "%v is returned as it is", s)
	}
}

// A serialization failure or a deadlock is retried Cfg.TxRetries times, and
// not at all with -1 (tasks.TxRetriesNone; issue 38: 0 could only mean the
// default); a server-side timeout (issue 38: 57014 with the context live)
// is a transient fault, bounded by UnavailableTimeout, not by TxRetries;
// once the context ended it is not retried.
func TestRetrierCountsConflictsAndServerTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conflict := &pgconn.PgError{Code: sqlStateSerializationFailure, Severity: "ERROR"}
	tries := func(txRetries int, err error) int {
		r := retrier{e: &Engine{Cfg: Config{TxRetries: txRetries, UnavailableTimeout: time.Hour}}}
		n := 0
		for n < 6 {
			again, _ := r.again(ctx, err)
			if !again {
				break
			}
			n++
		}
		return n
	}
	require.Equal(t, 0, tries(-1, conflict), "TxRetries -1: no retries")
	require.Equal(t, 3, tries(3, conflict))
	for _, code := range []string{sqlStateQueryCanceled, sqlStateLockNotAvailable} {
		timeout := &pgconn.PgError{Code: code, Severity: "ERROR"}
		require.True(t, transient(timeout), code)
		require.True(t, commitAnswered(timeout), "%s: an ERROR: the transaction did not commit", code)
		require.Equal(t, 6, tries(-1, timeout), "%s: retried while UnavailableTimeout lasts, whatever TxRetries", code)

		ended, cancel := context.WithCancel(ctx)
		cancel()
		r := retrier{e: &Engine{Cfg: Config{UnavailableTimeout: time.Hour}}}
		again, _ := r.again(ended, timeout)
		require.False(t, again, "%s after the context ended", code)
		err := classify(ended, timeout)
		require.ErrorIs(t, err, context.Canceled, "%s after the context ended is the context's end", code)
		require.NotErrorIs(t, err, arbortype.ErrUnavailable)
		require.ErrorIs(t, classify(ctx, timeout), arbortype.ErrUnavailable, "%s given up on", code)
	}
	for _, code := range []string{sqlStateIdleSessionTimeout, sqlStateTransactionTimeout, sqlStateIdleInTransactionTimeout} {
		require.True(t, transient(&pgconn.PgError{Code: code, Severity: "FATAL"}), code)
	}
	// A session ended while idle never read the statement that learns so;
	// one ended by transaction_timeout may have been ended after COMMIT.
	require.True(t, commitAnswered(&pgconn.PgError{Code: sqlStateIdleSessionTimeout, Severity: "FATAL"}))
	require.False(t, commitAnswered(&pgconn.PgError{Code: sqlStateTransactionTimeout, Severity: "FATAL"}))
}
