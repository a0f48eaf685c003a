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
